"""Records produced to an output topic, and the wait until the broker acknowledged each one.

Every output of a processor and of the webhook dispatcher (its dead letters) is produced
before the state that caused it is committed, and only counts as sent once acknowledged
(``acks=all``, idempotent producer): never lost. A fold writer's outputs (dead letters, late
records, side effects) go through this producer in Kafka transactions
(:mod:`refold.processors.runtime.output_transactions`: exactly once for a read_committed reader);
closed windows, failed lookups and the dispatcher's dead letters through :class:`Deliveries`
(at least once). One owner for the producer's settings and for the wait. The records' headers
are :mod:`refold.contracts.origin`'s.

Live client code (a producer, its delivery callbacks); not picklable: build it where it is used
(on the driver, or in each executor process).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, Message, Producer

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.delivery import announce, durable
from refold.contracts.kafka.logs import routed
from refold.contracts.origin import Headers

__all__ = ["DeadLetterError", "Deliveries", "output_producer"]

logger = logging.getLogger(__name__)

# While the broker is away a send waits, logging every _ACK_WAIT_S, up to librdkafka's own
# message timeout (300 s by default), then fails (nothing after it is committed).
_ACK_WAIT_S, _ACK_WAIT_MAX_S = 10.0, 310.0


class DeadLetterError(RefoldError):
    """An output record (a dead letter, a side effect, a window result...) was not acknowledged.

    Nothing after it is committed: the batch is not applied, so nothing is lost.
    """

    code = "DEAD_LETTER_FAILED"
    retriable = True


def output_producer(kafka: Mapping[str, str], who: str = "") -> Producer:
    """The producer of outputs: acknowledged by all replicas, idempotent, keys by murmur2.

    Args:
        kafka: librdkafka settings (with a ``transactional.id`` for a transactional one).
        who: Which producer, for the line that says once per process what it uses
            (:mod:`refold.contracts.kafka.delivery`); default by whether it is transactional.
    """
    if not who:
        transactional = "transactional.id" in kafka
        who = "a processor's transactional outputs" if transactional else "an output producer"
    config = durable({"partitioner": "murmur2_random", "linger.ms": "5", **dict(kafka)}, who)
    announce(who, config)
    return Producer(routed(config))


class Deliveries:
    """One send of several records: produce them, then :meth:`wait` for every acknowledgement.

    Args:
        producer: The output producer (see :func:`output_producer`).
        what: What is sent, for messages ("3 dead letters to orders.dlq").
    """

    def __init__(self, producer: Producer, what: str) -> None:
        self.producer = producer
        self.what = what
        self.failures: list[str] = []

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err.str())

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        """Queue one record."""
        self.producer.produce(topic, value, key, headers=headers, on_delivery=self._delivered)

    def wait(self) -> None:
        """Flush; raise unless every record was acknowledged (the caller commits nothing then).

        Raises:
            DeadLetterError: A record failed, or the broker did not answer in time.
        """
        remaining = self.producer.flush(_ACK_WAIT_S)
        waited = _ACK_WAIT_S
        while remaining and not self.failures and waited < _ACK_WAIT_MAX_S:
            logger.warning("%d of %s wait for the broker (%.0fs)", remaining, self.what, waited)
            remaining = self.producer.flush(_ACK_WAIT_S)
            waited += _ACK_WAIT_S
        if remaining or self.failures:
            msg = (
                f"{len(self.failures) or remaining} of {self.what} not acknowledged "
                f"({'; '.join(self.failures[:3]) or 'timeout'}); nothing after them committed"
            )
            raise DeadLetterError(msg)
