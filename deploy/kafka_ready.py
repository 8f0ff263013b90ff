"""Whether a freshly started broker is ready for clients: its coordinators answer.

A broker serves metadata seconds before its group and transaction coordinators can: their
internal topics (``__consumer_offsets``, ``__transaction_state``) are created by the first
client that asks for a coordinator, then each partition is loaded. A client meeting that
window logs librdkafka's ``GETPID ... Coordinator load in progress`` or fails with
``NOT_COORDINATOR``: right after ``refold up``, the next command did. So the local stack asks
both coordinators, for an id that maps to each partition of their topics (as Kafka maps a
group or transactional id: ``abs(javaHashCode(id)) % partitions``), before it says it is up.

Lifecycle: called by :class:`refold.deploy.local_stack.LocalStack` once the broker answers
metadata requests; the clients it makes are closed before it returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

_Conf = Mapping[str, str | int | float | bool]  # librdkafka settings, as confluent-kafka types them

__all__ = ["coordinators_unready", "ids_for_every_partition"]

_OFFSETS_TOPIC = "__consumer_offsets"
_TRANSACTIONS_TOPIC = "__transaction_state"
_PROBE = "refold-ready-probe"
_RETRY_S = 0.2  # between two rounds of asking (the load of an empty partition takes ms)


def _partition_of(identifier: str, partitions: int) -> int:
    """The partition of Kafka's internal topic that ``identifier`` maps to (Java's hashCode)."""
    h = 0
    data = identifier.encode("utf-16-be")  # Java strings hash their UTF-16 code units
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % partitions


def ids_for_every_partition(prefix: str, partitions: int) -> list[str]:
    """One id per partition of an internal topic of ``partitions`` partitions.

    Returns:
        ``partitions`` ids, the i-th mapping to partition i.
    """
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        candidate = f"{prefix}-{n}"
        found.setdefault(_partition_of(candidate, partitions), candidate)
        n += 1
    return [found[p] for p in range(partitions)]


def _partitions(client: Consumer | Producer, topic: str, timeout_s: float) -> int:
    metadata = client.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        msg = f"{topic} is not there yet"
        raise KafkaException(msg)
    return len(metadata.partitions)


def _group_answers(conf: _Conf, group: str, timeout_s: float) -> None:
    # Consumers, not an AdminClient: an admin handle dropped while a request of its was out
    # (a timeout under load) crashed librdkafka's main thread.
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.committed([TopicPartition(_OFFSETS_TOPIC, 0)], timeout=timeout_s)
    finally:
        consumer.close()


def _groups_answer(conf: _Conf, timeout_s: float) -> None:
    _group_answers(conf, _PROBE, timeout_s)  # the first FindCoordinator creates the topic
    metadata = Consumer({**conf, "group.id": _PROBE})
    try:
        count = _partitions(metadata, _OFFSETS_TOPIC, timeout_s)
    finally:
        metadata.close()
    for group in ids_for_every_partition(_PROBE, count):
        _group_answers(conf, group, timeout_s)


def _transactions_answer(conf: _Conf, timeout_s: float) -> None:
    def init(transactional_id: str) -> Producer:
        producer = Producer({**conf, "transactional.id": transactional_id})
        producer.init_transactions(timeout_s)
        return producer

    count = _partitions(init(_PROBE), _TRANSACTIONS_TOPIC, timeout_s)  # created by the first
    for transactional_id in ids_for_every_partition(_PROBE, count):
        init(transactional_id)


def coordinators_unready(conf: _Conf, deadline: float) -> str | None:
    """Ask the group and the transaction coordinator until both answer or ``deadline`` passes.

    Args:
        conf: librdkafka settings of the broker (``bootstrap.servers`` and security).
        deadline: ``time.monotonic()`` value to give up at.

    Returns:
        ``None`` once both answer for every partition of their topics; else the last error
        (for the operator's message).
    """
    # Their retries are expected here, not the user's news: no librdkafka log lines.
    quiet: dict[str, str | int | float | bool] = {**conf, "log_level": 0}
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return last
        try:
            _groups_answer(quiet, min(left, 10.0))
            _transactions_answer(quiet, min(left, 10.0))
        except (KafkaException, TimeoutError) as exc:
            last = str(exc)
            time.sleep(_RETRY_S)
        else:
            return None
