"""Records produced to an output topic, and the wait until the broker acknowledged each one.

Every output of a processor (dead letters, the late side output, side effects, closed windows,
failed lookups) is produced before the state that caused it is committed, and only counts as
sent once acknowledged (``acks=all``, idempotent producer): at least once, never lost. One
owner for the producer's settings and for the wait.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, Message, Producer

from processors.errors import DeadLetterError

__all__ = ["Deliveries", "Headers", "dead_letter_headers", "origin_headers", "output_producer"]

logger = logging.getLogger(__name__)

# While the broker is away a send waits, logging every _ACK_WAIT_S, up to librdkafka's own
# message timeout (300 s by default), then fails (nothing after it is committed).
_ACK_WAIT_S, _ACK_WAIT_MAX_S = 10.0, 310.0

Headers = list[tuple[str, str | bytes | None]]
# Longest error text kept in a dead letter's ``refold.error`` header.
_ERROR_HEADER_MAX = 2000


def origin_headers(
    topic: str, partition: int, offset: int, processor: str, generation: int
) -> Headers:
    """Where an output record comes from (consumers deduplicate on these) and who sent it."""
    return [
        ("refold.origin.topic", topic.encode()),
        ("refold.origin.partition", str(partition).encode()),
        ("refold.origin.offset", str(offset).encode()),
        ("refold.processor", processor.encode()),
        ("refold.generation", str(generation).encode()),
    ]


def dead_letter_headers(
    reason: str,
    detail: str,
    origin: tuple[str, int, int],
    processor: str,
    generation: int,
) -> Headers:
    """The headers of a dead letter: why (``refold.reason``, ``refold.error``) and its origin.

    Args:
        reason: Short machine-friendly reason (``bad-magic``, ``bad-body``, ...).
        detail: The error, for people (cut to 2000 bytes).
        origin: ``(topic, partition, offset)`` of the record.
        processor: The processor that refused it.
        generation: Its generation.
    """
    return [
        ("refold.reason", reason.encode()),
        ("refold.error", detail.encode()[:_ERROR_HEADER_MAX]),
        *origin_headers(*origin, processor, generation),
    ]


def output_producer(kafka: Mapping[str, str]) -> Producer:
    """The producer of a processor's outputs: acknowledged by all replicas, idempotent."""
    return Producer(
        {
            "acks": "all",
            "enable.idempotence": "true",
            "partitioner": "murmur2_random",
            "linger.ms": "5",
            **dict(kafka),
        }
    )


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
