"""Passive Kafka consumers: clients that are assigned partitions and never join or commit.

Every refold reader of a log (offset probes, Spark's range reads, replay's scan, ``refold
tail``, the API-key journal, the webhook dispatcher) assigns its partitions itself and keeps its
positions elsewhere (Redis, a checkpoint, the caller). librdkafka still wants a ``group.id``,
and its defaults would store and auto-commit offsets to that group and create a misspelt topic.
:func:`passive_consumer_config` is the one place the keys that prevent this are set, last, so a
user's librdkafka setting can tune a reader but never make it commit.

Clients that commit to a group on purpose (the webhook dispatcher's and a generation's mirror
groups) build on the same configuration: with ``enable.auto.commit`` off, only their explicit
``commit(offsets=...)`` calls write offsets.

Lifecycle: :func:`passive_consumer_config` is pure and returns a plain, picklable dict (Spark
ships it to executors); :func:`passive_consumer` makes a client and is called where it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from confluent_kafka import Consumer

from refold.contracts.kafka.logs import routed

__all__ = [
    "PASSIVE",
    "Isolation",
    "OffsetReset",
    "passive_consumer",
    "passive_consumer_config",
]

Isolation = Literal["read_committed", "read_uncommitted"]
OffsetReset = Literal["earliest", "latest"]

PASSIVE: Final[Mapping[str, Any]] = {
    # Positions live with the reader (Redis, a checkpoint, the caller), never in the group:
    # no automatic commit, and no offset stored for one.
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # A misspelt topic is an error, never a new topic (topics come from their specs).
    "allow.auto.create.topics": False,
}


def passive_consumer_config(
    kafka: Mapping[str, Any],
    group_id: str,
    *,
    tuning: Mapping[str, Any] | None = None,
    isolation: Isolation = "read_committed",
    eof: bool = False,
    offset_reset: OffsetReset = "earliest",
) -> dict[str, Any]:
    """The librdkafka configuration of a consumer that assigns partitions and never commits.

    Keys are applied in this order, later ones winning: ``tuning``, the user's ``kafka``
    settings, :data:`PASSIVE`, then ``group.id``, ``isolation.level``,
    ``enable.partition.eof`` and ``auto.offset.reset``. A user setting can override the
    caller's tuning, never the keys that keep the reader passive or the read semantics the
    caller relies on.

    Pure and picklable (no logger, no callback): safe to build on the driver and use on
    executors.

    Args:
        kafka: The user's librdkafka settings (at least ``bootstrap.servers``).
        group_id: The group id librdkafka requires; never joined, and committed to only by a
            caller that calls ``commit(offsets=...)`` itself.
        tuning: The caller's defaults (fetch sizes, waits, backoffs), each overridable by
            ``kafka``.
        isolation: ``read_committed`` skips records of aborted and open transactions
            (processors write their outputs in transactions).
        eof: Deliver an end-of-partition event when a read reaches the log end.
        offset_reset: Where a position outside the log (below its start after retention, or
            past its end after the topic was recreated) restarts.

    Returns:
        A new dict; the caller may add callbacks (``error_cb``, ``on_commit``) to it.
    """
    return {
        **(tuning or {}),
        **kafka,
        **PASSIVE,
        "group.id": group_id,
        "isolation.level": isolation,
        "enable.partition.eof": eof,
        "auto.offset.reset": offset_reset,
    }


def passive_consumer(
    kafka: Mapping[str, Any],
    group_id: str,
    *,
    tuning: Mapping[str, Any] | None = None,
    isolation: Isolation = "read_committed",
    eof: bool = False,
    offset_reset: OffsetReset = "earliest",
) -> Consumer:
    """A consumer with :func:`passive_consumer_config`, its librdkafka logs routed to logging.

    Not picklable: call it where the client is used (on the executor for Spark reads).

    Args:
        kafka: The user's librdkafka settings.
        group_id: The group id librdkafka requires (never joined).
        tuning: The caller's overridable defaults.
        isolation: The transaction isolation of reads.
        eof: Deliver end-of-partition events.
        offset_reset: Where a position outside the log restarts.

    Returns:
        A new, unassigned consumer.
    """
    config = passive_consumer_config(
        kafka,
        group_id,
        tuning=tuning,
        isolation=isolation,
        eof=eof,
        offset_reset=offset_reset,
    )
    return Consumer(routed(config))
