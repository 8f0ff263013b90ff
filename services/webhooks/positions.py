"""Where the webhook dispatcher reads: its consumer, each partition's start and the copy in Kafka.

Positions live in Redis (:class:`~refold.services.webhooks.store.WebhookStore`); a copy of
them is committed to the dispatcher's consumer group after each Redis commit, for standard lag
tools and for a Redis that restarted empty (:func:`start_positions` takes the later of the
two).

Lifecycle: called from the dispatcher's loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from refold.contracts.kafka.consumers import passive_consumer
from refold.contracts.kafka.offsets import LogOffsets, OffsetsError
from refold.services.webhooks.errors import WebhookConfigError
from refold.services.webhooks.store import DispatcherLease, WebhookStore

__all__ = [
    "TP",
    "StartPositions",
    "caught_up",
    "dispatcher_consumer",
    "lag",
    "mirror_positions",
    "mirrored_positions",
    "start_positions",
]

logger = logging.getLogger(__name__)

TP = tuple[str, int]

# Consumer tuning (a caller's librdkafka settings may override these), each with its reason:
_CONSUMER_TUNING: Mapping[str, Any] = {
    # Low latency for a trickle of critical insights: an answer comes as soon as a record
    # arrives; the long-poll only bounds an idle fetch.
    "fetch.wait.max.ms": 250,
    "fetch.queue.backoff.ms": 10,  # the 1 s default throttles catching up on a backlog
    "queued.min.messages": 10_000,  # prefetch; a batch waiting out an outage holds little
}

StartPositions = tuple[dict[TP, int], dict[TP, int]]
"""The log ends (when running ``until_end``) and the position of every partition."""


def dispatcher_consumer(kafka: Mapping[str, Any], group: str) -> Consumer:
    """The dispatcher's consumer: it assigns partitions itself and never joins a group.

    Its positions live in Redis, and a leased role needs no rebalance. Auto-commit stays off
    (the passive keys win over any user setting); :func:`mirror_positions` commits a copy of
    the positions to this group explicitly, for standard lag tools.
    """
    return passive_consumer(
        kafka,
        group,
        tuning=_CONSUMER_TUNING,
        # Insights are a processor's outputs, written in Kafka transactions: the records of a
        # batch that did not commit are never delivered.
        isolation="read_committed",
        # Only when the stored position is gone: below the log start (retention; logged at
        # start) or past the end (the topic was recreated): start at what the log holds.
        offset_reset="earliest",
    )


def start_positions(
    kafka: Mapping[str, Any],
    topics: Sequence[str],
    store: WebhookStore,
    lease: DispatcherLease,
    consumer: Consumer,
    *,
    name: str,
    from_end: bool,
    until_end: bool,
) -> StartPositions:
    """The log ends (when running ``until_end``) and the position of every partition.

    A position is the later of Redis' and its copy in the dispatcher's Kafka consumer group:
    Redis restarted empty (or from an older state) must not deliver again what was delivered
    (the copy is committed after each Redis commit). A partition with no position starts at
    the log end when ``from_end``, else at the log start.
    """
    with LogOffsets(kafka) as offsets:
        try:
            tps = [(t, p) for t in topics for p in offsets.partitions(t)]
        except OffsetsError as exc:
            msg = (
                f"{exc}. Operator action: check the topic names (a pattern processor "
                "creates <processor>.insights when it starts) and the broker address "
                "(REFOLD_KAFKA__BOOTSTRAP_SERVERS)."
            )
            raise WebhookConfigError(msg) from exc
        stored = store.positions()
        copied = mirrored_positions(consumer, tps, name)
        ahead = {tp: o for tp, o in copied.items() if o > stored.get(tp, -1)}
        if ahead:
            logger.warning(
                "%s: Redis lacks delivered positions (restarted empty or from an older "
                "state?); resuming %s from their copy in Kafka",
                name,
                ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(ahead.items())),
            )
            store.commit(lease, ahead, [], {})
            stored = store.positions()
        missing = [tp for tp in tps if tp not in stored]
        if missing:
            start = offsets.end_offsets(missing) if from_end else offsets.start_offsets(missing)
            store.init_positions(lease, start)
            stored = store.positions()
        positions = {tp: stored[tp] for tp in tps}
        log_start = offsets.start_offsets(tps)
        ends = offsets.end_offsets(tps) if until_end else {}
    for tp, position in positions.items():
        if position < log_start[tp]:
            logger.error(
                "%s: offsets %d-%d of %s/%d were deleted (retention) before delivery",
                name,
                position,
                log_start[tp] - 1,
                *tp,
            )
    return ends, positions


def mirrored_positions(consumer: Consumer, tps: Sequence[TP], name: str) -> dict[TP, int]:
    """The copy of the positions in the consumer group (empty when the broker fails)."""
    try:
        found = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
    except KafkaException as exc:
        logger.warning("%s: no copy of the positions from Kafka (%s)", name, exc)
        return {}
    return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}


def mirror_positions(consumer: Consumer, positions: Mapping[TP, int], name: str) -> None:
    """Copy committed positions to the consumer group (Redis stays the source of truth)."""
    if not positions:
        return
    offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())]
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:  # the next commit copies them again
        logger.warning("%s: positions not copied to Kafka (%s)", name, exc)


def caught_up(positions: Mapping[TP, int], ends: Mapping[TP, int]) -> bool:
    """True when every partition's position reached its end at start."""
    return all(positions.get(tp, 0) >= end for tp, end in ends.items())


def lag(consumer: Consumer, positions: Mapping[TP, int]) -> int:
    """Records behind the partitions' high watermarks (the fetch path's: no extra request)."""
    behind = 0
    for (topic, partition), position in positions.items():
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        if high >= 0:
            behind += max(0, high - position)
    return behind
