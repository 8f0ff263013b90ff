"""``python -m bench cluster --windows``: what sharding a window processor costs its reads.

The write side is :mod:`bench.redis_cluster`'s loop with sales_windows in place of order_state.
Here: the generation it writes is registered (live, with its shards) so that a
:class:`~refold.services.reader.window_reader.WindowReader` and the
:class:`~refold.processors.runtime.window_store.WindowCloser` read it as a processor's, and the
read cost of each: a window read (tumbling: one bucket per shard; sliding: 30), an hour's
distinct count (60 sketches per shard, their union), and the closer emitting every window the
watermark passed (per window).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from refold.contracts.codec import EventCodec
from refold.contracts.processors import EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.contracts.topics import TopicSpec
from refold.processors.fold.projection import Projection
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.services.reader.window_reader import WindowReader

__all__ = ["READS", "read_costs", "windows_target", "windows_writer"]

READS = 200  # window reads timed per kind of read (each a different window)
_HOUR_MS = 3_600_000


def windows_target(
    url: str, kafka: tuple[tuple[str, str], ...], dlq: str, shards: int, topic: str
) -> FoldTarget:
    """A new live generation of sales_windows under its own prefix, sharded ``shards`` ways."""
    prefix = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    registry = GenerationRegistry.of(redis_client(url), "sales_windows", prefix)
    generation = registry.create({SHARDS_FIELD: shards}, live=True)
    return FoldTarget(
        "sales_windows",
        generation,
        url,
        prefix,
        kafka,
        dlq,
        event_time=SALES_WINDOWS.event_time,
        topics=(topic,),
        shards=shards,
    )


def windows_writer(target: FoldTarget) -> FoldWriter:
    """The fold envelope writing sales_windows (typed for entity folds; it takes either)."""
    return FoldWriter(target, cast("Projection", SalesWindows()))


def _samples(records: Sequence[SourceRecord], rng: random.Random) -> list[tuple[int, str]]:
    """``(paid_at, currency)`` of :data:`READS` payments picked at random."""
    codec = EventCodec()
    picked = rng.sample(list(records), min(READS * 3, len(records)))
    paid = [codec.decode(r.value) for r in picked]
    found = [
        (int(d.data["paid_at"]), str(d.data["currency"]))
        for d in paid
        if d.event_type == "OrderPaid"
    ]
    return found[:READS]


def _per_read_us(calls: Sequence[Any]) -> float:
    started = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - started) / max(len(calls), 1) * 1e6


def read_costs(
    target: FoldTarget, records: Sequence[SourceRecord], results_topic: str
) -> dict[str, float]:
    """Microseconds per window read (three kinds) and per window the closer emits."""
    client = redis_client(target.redis_url)
    fold = SalesWindows()
    event_time = cast("EventTime", target.event_time)
    reader = WindowReader.from_fold(
        client, fold, target.key_prefix, lateness_ms=event_time.lateness_ms
    )
    samples = _samples(records, random.Random(7))
    minute = 60_000
    step = 10_000
    costs = {
        "tumbling": _per_read_us(
            [
                lambda at=at, group=group: reader.window(
                    "per_minute", group, at - at % minute + minute
                )
                for at, group in samples
            ]
        ),
        "sliding": _per_read_us(
            [
                lambda at=at, group=group: reader.window(
                    "five_minutes_sliding", group, at - at % step + step
                )
                for at, group in samples
            ]
        ),
        "distinct_hour": _per_read_us(
            [
                lambda at=at, group=group: reader.distinct(
                    "per_minute", "payment_methods", group, at - at % _HOUR_MS, at
                )
                for at, group in samples[: READS // 4]
            ]
        ),
    }
    closer = WindowCloser(
        target.layout,
        target.generation,
        fold,
        event_time.lateness_ms,
        target.redis_url,
        dict(target.kafka),
        results_topic,
    )
    started = time.perf_counter()
    closed = closer.close()
    costs["closer"] = (time.perf_counter() - started) / max(closed, 1) * 1e6
    costs["closed"] = closed
    return costs


def results_spec(topic: str) -> TopicSpec:
    """The closer's results topic."""
    return TopicSpec(topic, 1, "(group)", ("(window)",))
