"""The Parquet archive against the entity fold, in one run over the same order events.

``python -m bench archive`` (its own stack and backlog). Over one backlog of order events:

1. **entity fold**: order_state catching up (the baseline; steady state after batch 0);
2. **archive**: the archive processor catching up on the same records (its three other topics
   empty): every event decoded into typed columns and written as Parquet, one file per event
   type, event date and Kafka partition of each micro-batch, each file flushed to disk (fsync)
   before the batch's positions move in Redis (``--no-fsync`` measures without);
3. **what it left**: files, bytes per event, rows (== events, read from the Parquet footers);
4. **compaction**: ``refold archive compact`` merging those files, its time and file count;
5. **reading it back**: a DuckDB aggregate over the whole archive, and its time.

Prints a table and writes ``bench/results/archive.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from bench.backlog import ORDERS_TOPIC, produce_orders
from bench.windows import catch_up_alone, order_state_baseline
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.topics import TopicSpec
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.archive.config import ArchiveOptions
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import ArchiveProcessor
from refold.processors.runtime.archive.maintenance import archive_status, compact
from refold.processors.runtime.archive.sink import ArchivePlan
from refold.processors.runtime.envelope import FoldTarget

__all__ = ["RESULTS", "archive_rows_table", "main", "measure_archive"]

RESULTS = Path(__file__).parent / "results" / "archive.json"
PREFIX = "bench-archive"
# The archive reads four topics; three stay empty so it archives exactly order_state's records.
_EMPTY = tuple(
    TopicSpec(f"bench.archive.{spec.name}.empty", spec.partitions, spec.key_field, spec.event_types)
    for spec in (PAGEVIEWS, SEARCHES, CUSTOMERS)
)


def _ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if ours and theirs else None


def measure_archive(
    stack: LocalStack, state: Path, orders: int, baseline: dict[str, float], *, fsync: bool
) -> dict[str, Any]:
    """The archive catching up on :data:`ORDERS_TOPIC`; what it wrote; compaction; a query."""
    ensure_topics({"bootstrap.servers": stack.bootstrap_servers}, list(_EMPTY))
    root = state / "archive"
    options = ArchiveOptions(
        topics=[ORDERS_TOPIC.name, *(t.name for t in _EMPTY)],
        dead_letter_topic=f"{ORDERS_TOPIC.name}.dlq",
        root=root,
        fsync=fsync,
    )
    run, rss = catch_up_alone(stack, state, PREFIX, "archive", options, orders)
    archive = {**run.summary(), "peak_rss_mb": rss, "fsync": fsync}
    plan = ArchivePlan(
        FoldTarget(
            "archive",
            1,
            stack.redis_url,
            PREFIX,
            (("bootstrap.servers", stack.bootstrap_servers),),
            options.dead_letter_topic or "",
        ),
        ArchiveProcessor("archive", root, (), DATES, fsync=fsync),
        EventCodec(),
    )
    tables, problems = archive_status(plan)
    archive["files"] = sum(t.files for t in tables.values())
    archive["bytes"] = sum(t.bytes for t in tables.values())
    archive["rows"] = sum(t.rows for t in tables.values())
    archive["tables"] = len(tables)
    archive["dates"] = sum(t.dates for t in tables.values())
    archive["problems"] = len(problems)
    started = time.perf_counter()
    merged = compact(plan)
    seconds = time.perf_counter() - started
    after, _problems = archive_status(plan)
    compaction = {
        "seconds": seconds,
        "files_before": archive["files"],
        "files_after": sum(t.files for t in after.values()),
        "rows_after": sum(t.rows for t in after.values()),
        "groups": merged.groups,
    }
    started = time.perf_counter()
    db = duckdb.connect()
    paid = db.execute(
        "SELECT count(*), sum(amount_minor) FROM read_parquet(?, hive_partitioning = true)",
        [f"{root}/OrderPaid/*/*.parquet"],
    ).fetchone()
    query_s = time.perf_counter() - started
    return {
        "events": orders,
        "order_state": baseline,
        "archive": archive,
        "ratio_steady": _ratio(archive["rate_steady"], baseline["rate_steady"]),
        "ratio_wall": _ratio(archive["rate_wall"], baseline["rate_wall"]),
        "compaction": compaction,
        "duckdb": {"seconds": query_s, "order_paid_rows": paid[0] if paid else 0},
    }


def _rate(figures: dict[str, Any]) -> str:
    steady = figures["rate_steady"]
    return (
        f"{f'{steady:,.0f} ev/s' if steady else 'n/a (one batch)'} "
        f"(incl. start-up {figures['rate_wall']:,.0f} ev/s, {figures['wall_s']:.1f} s; "
        f"peak RSS {figures['peak_rss_mb']:,.0f} MB)"
    )


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def archive_rows_table(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The archive section of a benchmark table."""
    archive, compaction = result["archive"], result["compaction"]
    return [
        ("archive: order events (same backlog)", f"{result['events']:,}"),
        ("order_state (entity fold), steady", _rate(result["order_state"])),
        (f"archive (Parquet, fsync {'on' if archive['fsync'] else 'off'}), steady", _rate(archive)),
        (
            "archive / order_state, steady (wall)",
            f"{_times(result['ratio_steady'])} ({_times(result['ratio_wall'])})",
        ),
        (
            "archive: files, size",
            f"{archive['files']:,} files in {archive['tables']} tables, {archive['dates']} "
            f"table-dates; {archive['bytes'] / 1e6:,.1f} MB "
            f"({archive['bytes'] / max(archive['rows'], 1):,.0f} B/event, zstd)",
        ),
        (
            "archive rows == events",
            f"{archive['rows']:,} == {result['events']:,}: "
            f"{'yes' if archive['rows'] == result['events'] else 'NO'}",
        ),
        (
            "compaction",
            f"{compaction['files_before']:,} -> {compaction['files_after']:,} files in "
            f"{compaction['seconds']:.1f} s",
        ),
        (
            "DuckDB: count + sum over OrderPaid",
            f"{result['duckdb']['order_paid_rows']:,} rows in "
            f"{result['duckdb']['seconds'] * 1000:,.0f} ms",
        ),
    ]


def _records(stack: LocalStack, topic: str) -> int:
    offsets = LogOffsets({"bootstrap.servers": stack.bootstrap_servers})
    try:
        return sum(offsets.end_offsets([(topic, p) for p in offsets.partitions(topic)]).values())
    finally:
        offsets.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench archive``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench archive",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=500_000, help="order events")
    parser.add_argument(
        "--no-fsync", action="store_true", help="do not flush each file before its commit"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the stack's, processors' and archive's files here (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-archive-")
    ) as tmp:
        state = Path(tmp)
        with LocalStack(state / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            ensure_topics(
                {"bootstrap.servers": stack.bootstrap_servers},
                [ORDERS_TOPIC, TopicSpec(f"{ORDERS_TOPIC.name}.dlq", 1, "(key)", ("(any)",))],
            )
            produce_orders(stack.bootstrap_servers, args.events)
            orders = _records(stack, ORDERS_TOPIC.name)
            print(f"backlog: {orders:,} order events", flush=True)
            run, rss = order_state_baseline(stack, state, "bench-archive-base", orders)
            baseline = {**run.summary(), "peak_rss_mb": rss}
            result = measure_archive(stack, state, orders, baseline, fsync=not args.no_fsync)
    rows = [("machine", f"{os.cpu_count()} cores"), *archive_rows_table(result)]
    width = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\nresults written to {RESULTS}")
    return 0
