"""The archive as the log's cold tier: a rebuild's archive part against its Kafka part.

``python -m bench cold-tier [--events N]`` (its own stack and backlog). Over one backlog of order
events (``ORDERS_TOPIC``, 8 partitions):

1. the archive task (``archive_ranges``, no Spark) archives the whole log in batches of 200k,
   as the archive processor's micro-batches would: files, bytes per event;
2. **read**: every record of the log read by refold's reader (``read_messages``), once from
   Kafka, then, after ``delete_records`` drops the whole log, from the archive (records/s);
3. **fold**: the same reads folded by order_state's exactly-once writer (``FoldWriter``: decode,
   fold, one Redis transaction per chunk), one process, no Spark, into a generation of their
   own: the rebuild's task body, from the log and from the archive (events/s); both generations
   are compared key by key.

The fold and its Redis writes are the same on both sides; what differs is where the records
come from. Prints a table and writes ``bench/results/cold_tier.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from bench.backlog import ORDERS_TOPIC, produce_orders
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import position_field
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import dead_letter_spec, effects_spec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import ArchiveProcessor
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import (
    DEFAULT_NOTIFICATIONS_TOPIC,
    OrderStateProjection,
)
from refold.processors.runtime.archive.sink import ArchivePlan, archive_ranges
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages

__all__ = ["RESULTS", "main", "measure_cold_tier"]

RESULTS = Path(__file__).parent / "results" / "cold_tier.json"
PREFIX = "bench-cold"
# Records per archive batch: the processors' default maxOffsetsPerTrigger.
_BATCH = 200_000


def _ranges(ends: dict[tuple[str, int], int]) -> tuple[tuple[str, int, int, int], ...]:
    return tuple((t, p, 0, e) for (t, p), e in sorted(ends.items()))


def _timed_read(options: SourceOptions, ranges: tuple[Any, ...]) -> tuple[int, float]:
    started = time.perf_counter()
    count = sum(len(chunk) for chunk in read_messages(options, ranges))
    return count, time.perf_counter() - started


def _timed_fold(
    target: FoldTarget, options: SourceOptions, ranges: tuple[Any, ...]
) -> tuple[int, float]:
    """Fold every record of ``ranges`` into ``target``'s generation, as a fold task does."""
    registry = GenerationRegistry.of(redis_client(target.redis_url), "order_state", PREFIX)
    registry.create({}, live=False)
    registry.set_positions(target.generation, {position_field(t, p): 0 for t, p, _s, _e in ranges})
    writer = FoldWriter(target, OrderStateProjection())
    started = time.perf_counter()
    applied = 0

    def chunks() -> Iterator[list[SourceRecord]]:
        for chunk in read_messages(options, ranges):
            yield [SourceRecord.of_message(m) for m in chunk]

    for batch_id, records in enumerate(chunks()):
        applied += writer.apply(records, batch_id=batch_id).applied
    return applied, time.perf_counter() - started


def measure_cold_tier(stack: LocalStack, state: Path, events: int) -> dict[str, Any]:
    """Archive the backlog, then read and fold it from Kafka and from the archive."""
    kafka = {"bootstrap.servers": stack.bootstrap_servers}
    ensure_topics(
        kafka,
        [
            ORDERS_TOPIC,
            dead_letter_spec("archive", "bench.cold.dlq"),
            effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),
        ],
    )
    produce_orders(stack.bootstrap_servers, events)
    offsets = LogOffsets(kafka)
    try:
        ends = offsets.end_offsets([(ORDERS_TOPIC.name, p) for p in range(ORDERS_TOPIC.partitions)])
    finally:
        offsets.close()
    root = state / "archive"
    client = redis_client(stack.redis_url)
    target = FoldTarget(
        "archive", 1, stack.redis_url, PREFIX, tuple(kafka.items()), "bench.cold.dlq"
    )
    plan = ArchivePlan(
        target, ArchiveProcessor("archive", root, ORDERS_TOPIC.event_types, DATES), EventCodec()
    )
    GenerationRegistry.of(client, "archive", PREFIX).create({}, live=True)
    plan.store.claim("archive", PREFIX, 1)
    started = time.perf_counter()
    done = dict.fromkeys(ends, 0)
    batch_id = 0
    while done != ends:
        step = {tp: min(e, done[tp] + _BATCH // len(ends)) for tp, e in ends.items()}
        ranges = tuple((t, p, done[t, p], step[t, p]) for t, p in sorted(ends))
        archive_ranges(plan, ranges, batch_id)
        done, batch_id = step, batch_id + 1
    archived_s = time.perf_counter() - started
    files = list(root.rglob("*.parquet"))
    size = sum(f.stat().st_size for f in files)

    whole = _ranges(ends)
    log = SourceOptions(kafka=tuple(kafka.items()), topics=(ORDERS_TOPIC.name,))
    cold = dataclasses.replace(log, archive_root=str(root))
    read_kafka = _timed_read(log, whole)
    fold_target = dataclasses.replace(target, processor="order_state", generation=1)
    fold_kafka = _timed_fold(fold_target, log, whole)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for future in admin.delete_records(
        [TopicPartition(t, p, e) for (t, p), e in ends.items()]
    ).values():
        future.result(timeout=60)
    read_archive = _timed_read(cold, whole)
    fold_archive = _timed_fold(dataclasses.replace(fold_target, generation=2), cold, whole)
    same = _same_generations(client)
    total = sum(ends.values())
    return {
        "events": total,
        "archive": {"seconds": archived_s, "files": len(files), "bytes_per_event": size / total},
        "read": {"kafka": _rate(read_kafka), "archive": _rate(read_archive)},
        "fold": {"kafka": _rate(fold_kafka), "archive": _rate(fold_archive)},
        "generations_equal": same,
    }


def _rate(counted: tuple[int, float]) -> dict[str, float]:
    count, seconds = counted
    return {"records": count, "seconds": seconds, "per_s": count / seconds if seconds else 0.0}


def _same_generations(client: Any) -> bool:
    from refold.contracts.registry import processor_spec
    from refold.replay.generations_admin import diff_generations

    return diff_generations(processor_spec("order_state"), client, PREFIX, 1, 2).identical


def render(result: dict[str, Any]) -> str:
    """The table for people: archive part against Kafka part, same run."""
    read, fold = result["read"], result["fold"]
    lines = [
        f"cold tier, {result['events']:,} order events, 8 partitions "
        f"(archived in {result['archive']['seconds']:.1f} s: {result['archive']['files']} files, "
        f"{result['archive']['bytes_per_event']:.1f} B/event)",
        f"{'':<34} {'from Kafka':>14} {'from the archive':>18} {'archive/Kafka':>14}",
    ]
    for name, part in (("read (read_messages), rec/s", read), ("fold (FoldWriter), ev/s", fold)):
        ratio = part["archive"]["per_s"] / part["kafka"]["per_s"] if part["kafka"]["per_s"] else 0
        lines.append(
            f"{name:<34} {part['kafka']['per_s']:>14,.0f} {part['archive']['per_s']:>18,.0f} "
            f"{ratio:>13.2f}x"
        )
    lines.append(
        f"generation from the archive == generation from Kafka: {result['generations_equal']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench cold-tier``."""
    parser = argparse.ArgumentParser(prog="python -m bench cold-tier", description=__doc__)
    parser.add_argument("--events", type=int, default=500_000, help="order events (500,000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="refold-bench-cold-") as tmp:
        state = Path(tmp)
        with LocalStack(state / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            result = measure_cold_tier(stack, state, args.events)
    print(render(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        RESULTS.write_text(json.dumps(result, indent=2))
    return 0 if result["generations_equal"] else 1
