"""The envelope alone, in one process (no Spark): entity fold against additive windows.

Reads the first records of the orders backlog once, then applies them through
:class:`~refold.processors.runtime.envelope.FoldWriter` in task-sized chunks for order_state and for
sales_windows (each into a fresh generation), and times the closer emitting every window the
watermark passed. This separates what the window kind costs from what Spark costs around it.
order_state runs a second time with de-duplication by event id (``dedupe=EventId()``), for
what remembering each entity's latest ids costs.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.processors import EventId, EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec, effects_spec
from refold.processors.fold.projection import Projection
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import (
    DEFAULT_NOTIFICATIONS_TOPIC,
    OrderStateProjection,
)
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows

__all__ = ["apply_in_chunks", "envelope_only", "envelope_rows", "read_records"]

_CHUNK = 25_000  # records per transaction, as a Spark task applies them


def read_records(bootstrap: str, topic: str, limit: int) -> list[SourceRecord]:
    """About ``limit`` records of ``topic``, an equal share from each partition."""
    kafka = {"bootstrap.servers": bootstrap}
    with LogOffsets(kafka) as offsets:
        share = max(1, limit // len(offsets.partitions(topic)))
    return [
        SourceRecord.of_message(m)
        for chunk in read_log(kafka, topic, share, slot="bench")
        for m in chunk
    ]


def apply_in_chunks(writer: FoldWriter, records: Sequence[SourceRecord]) -> float:
    """Apply ``records`` in task-sized transactions; returns the seconds it took."""
    started = time.perf_counter()
    for i in range(0, len(records), _CHUNK):
        writer.apply(records[i : i + _CHUNK], batch_id=i // _CHUNK)
    return time.perf_counter() - started


def envelope_only(bootstrap: str, redis_url: str, topic: str, limit: int) -> dict[str, Any]:
    """Apply the same records as order_state and as sales_windows; time the closer too."""
    records = read_records(bootstrap, topic, limit)
    run = uuid.uuid4().hex[:8]
    kafka = (("bootstrap.servers", bootstrap),)
    dlq, results = f"bench-envelope-{run}.dlq", f"bench-envelope-{run}.windows"
    ensure_topics(
        dict(kafka),
        [
            TopicSpec(dlq, 1, "(key)", ("(any)",)),
            TopicSpec(results, 4, "(group)", ("(window)",)),
            effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),  # order_state's side effects go there
        ],
    )
    prefix = f"bench-envelope-{run}"
    entity = FoldTarget("order_state", 1, redis_url, prefix, kafka, dlq)
    windows = FoldTarget(
        "sales_windows",
        1,
        redis_url,
        prefix,
        kafka,
        dlq,
        event_time=SALES_WINDOWS.event_time,
        topics=(topic,),
    )
    entity_s = apply_in_chunks(FoldWriter(entity, OrderStateProjection()), records)
    deduped = dataclasses.replace(entity, generation=2, dedupe=EventId())
    dedupe_s = apply_in_chunks(FoldWriter(deduped, OrderStateProjection()), records)
    # The envelope takes either kind of fold; it is typed for entity folds.
    windows_s = apply_in_chunks(FoldWriter(windows, cast("Projection", SalesWindows())), records)
    client = redis_client(redis_url)
    GenerationRegistry.of(client, "sales_windows", prefix).create({"topics": [topic]}, live=True)
    closer = WindowCloser(
        windows.layout,
        1,
        SalesWindows(),
        cast("EventTime", SALES_WINDOWS.event_time).lateness_ms,
        redis_url,
        dict(kafka),
        results,
    )
    started = time.perf_counter()
    closed = closer.close()
    close_s = time.perf_counter() - started
    return {
        "records": len(records),
        "order_state_rate": len(records) / entity_s,
        "order_state_dedupe_rate": len(records) / dedupe_s,
        "sales_windows_rate": len(records) / windows_s,
        "ratio": entity_s / windows_s,
        "windows_closed": closed,
        "close_us_per_window": close_s / max(closed, 1) * 1e6,
        "with_closing_rate": len(records) / (windows_s + close_s),
    }


def envelope_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The in-process section of the windows table."""
    return [
        ("in-process envelope (no Spark), records", f"{result['records']:,}"),
        ("  order_state fold + write", f"{result['order_state_rate']:,.0f} ev/s"),
        (
            "  order_state with dedupe=EventId()",
            f"{result['order_state_dedupe_rate']:,.0f} ev/s "
            f"({result['order_state_dedupe_rate'] / result['order_state_rate']:.0%} of without)",
        ),
        (
            "  sales_windows fold + write",
            f"{result['sales_windows_rate']:,.0f} ev/s ({result['ratio']:.2f}x order_state)",
        ),
        (
            "  sales_windows closing",
            f"{result['windows_closed']:,} windows, {result['close_us_per_window']:,.0f} us each; "
            f"with closing {result['with_closing_rate']:,.0f} ev/s",
        ),
    ]
