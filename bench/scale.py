"""``python -m bench scale``: the scale curve, 1M, 4M and 10M order events (issue 23, item 5).

One private local stack, one order stream produced in steps (the topic grows from one size to
the next: :func:`bench.backlog.produce_order_steps`). At each size, on the whole topic:

1. **oracle**: the log read back and folded the plain way (order_state's states,
   sales_windows' buckets), to check every run below against;
2. **order_state** (the entity fold) catching up in a fresh generation (``--available-now``,
   as ``make bench``): events/s in steady state (after batch 0) and including start-up,
   CPU-seconds per million events (less sensitive to a shared machine's load than events/s),
   peak RSS of the driver, the JVM and the Python workers (:mod:`bench.catch_up`), Redis
   ``used_memory`` and bytes per entity two ways: the ``used_memory`` delta of the run over the
   entities (everything the generation keeps: states, positions, metadata) and ``MEMORY
   USAGE`` of a sample of state keys (the state alone);
3. **sales_windows** (a window processor) the same way; its entities are window buckets
   (``w:``), each with a HyperLogLog beside it (``wd:``). Buckets expire a day of event time
   after their window (the spec's retention), so they do not grow with the log as entities do;
4. **Kafka Streams** (``bench/peers``' peer, RocksDB, exactly_once_v2) folding order_state's
   states in an application of its own: events/s, CPU-seconds per million events, peak RSS
   and its state store's size on disk
   (the RocksDB files, after it closed) per entity. It has no window peer, so the windows have
   refold's side only.

Redis is flushed before each size, so ``used_memory`` is that size's alone. Every final state
is compared with the oracle (order_state and Kafka Streams: every state; sales_windows: every
bucket); a mismatch prints FAILED and the run exits 1. Prints a table with the ratios of each
size to the smallest (flat = near 1), the load average before each size, and writes
``bench/results/scale.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import redis

from bench.backlog import ORDERS_TOPIC, produce_order_steps
from bench.peers.engines import ENGINES, Job
from bench.peers.measure import measure
from bench.peers.oracle import Verdict, compare, redis_states
from bench.scale_report import per_entity, ratios, table
from bench.windows import catch_up_run, memory_per_key
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import GenerationKeys, position_field
from refold.contracts.processors import ProcessorOptions
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec, effects_spec
from refold.contracts.windows import watermark_of
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.fold.oracle import WindowOracle, fold_all, fold_windows
from refold.processors.fold.projection import State
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.kafka_ranges import read_log
from refold.processors.runtime.window_store import generation_watermark
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows

__all__ = ["RESULTS", "main"]

RESULTS = Path(__file__).parent / "results" / "scale.json"
TOPIC = ORDERS_TOPIC.name
NOTIFICATIONS = f"{TOPIC}.notifications"
_MB = 1024 * 1024

Buckets = dict[tuple[str, int, str], dict[str, int]]


def _oracle(bootstrap: str) -> tuple[dict[str, State], WindowOracle]:
    """order_state's states and sales_windows' buckets, folded the plain way from the log.

    One pass over the log: order_state folds every record; the ``OrderPaid`` (what
    sales_windows reads; the others touch no clock) are kept with their positions and folded
    into windows after.
    """
    codec = EventCodec()
    windows = SalesWindows()
    paid: list[tuple[str, int, str, dict[str, Any]]] = []

    def records() -> Iterator[tuple[str, dict[str, Any]]]:
        for chunk in read_log({"bootstrap.servers": bootstrap}, TOPIC, slot="scale-oracle"):
            for message in chunk:
                event = codec.decode(message.value())
                if event.event_type in windows.event_types:
                    field = position_field(message.topic() or "", message.partition() or 0)
                    paid.append((field, message.offset() or 0, event.event_type, event.data))
                yield event.event_type, event.data

    states = fold_all(OrderStateProjection(), records()).states
    event_time = SALES_WINDOWS.event_time
    if event_time is None:  # pragma: no cover - the spec declares it
        msg = "sales_windows has no event time"
        raise RuntimeError(msg)
    return states, fold_windows(windows, event_time, paid)


def _live_keys(client: redis.Redis, name: str, prefix: str) -> GenerationKeys:
    registry = GenerationRegistry.of(client, name, prefix)
    live = registry.live()
    if live is None:
        msg = f"{name} has no live generation under {prefix!r}"
        raise RuntimeError(msg)
    return registry.keys(live)


def _bucket_dump(client: redis.Redis, keys: GenerationKeys) -> Buckets:
    """Every window bucket of a generation: ``(window, start, group)`` -> aggregates."""
    names = [
        raw.decode() if isinstance(raw, bytes) else str(raw)
        for raw in client.scan_iter(match=keys.namespace_pattern("w:"), count=1000)
    ]
    out: Buckets = {}
    for start in range(0, len(names), 1000):
        chunk = names[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.hgetall(name)
        for name, fields in zip(chunk, pipe.execute(), strict=True):
            bucket = keys.parse_window_bucket(name)
            if bucket is not None:
                out[bucket] = {k.decode(): int(v) for k, v in fields.items()}
    return out


def _named(buckets: Buckets) -> dict[str, dict[str, Any]]:
    """Buckets by ``window:start:group`` (the form :func:`compare` takes)."""
    return {f"{w}:{s}:{g}": dict(aggregates) for (w, s, g), aggregates in buckets.items()}


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _sampled_average(kinds: Mapping[str, Mapping[str, float]], namespace: str) -> float | None:
    """``MEMORY USAGE`` averaged over the sampled keys of ``namespace`` (every kind of it)."""
    chosen = [f for kind, f in kinds.items() if kind.startswith(f"{namespace}:")]
    sampled = sum(f["sampled"] for f in chosen)
    return sum(f["avg_bytes"] * f["sampled"] for f in chosen) / sampled if sampled else None


def _spark_run(
    stack: LocalStack, state: Path, prefix: str, name: str, options: Any, events: int
) -> dict[str, Any]:
    """One processor catching up alone; its figures and the Redis memory it added."""
    client = redis_client(stack.redis_url)
    before, keys_before = _used_memory(client), int(client.dbsize())
    whole = catch_up_run(stack, state, prefix, name, options, events)
    run = whole.processors[name]
    used = _used_memory(client) - before
    return {
        f"{name}_rate_steady": run.rate_steady or None,
        f"{name}_rate_wall": run.events / run.done_s,
        f"{name}_batch0_s": run.batch0_s,
        f"{name}_peak_rss_mb": whole.peak_rss_mb,
        f"{name}_cpu_s_per_million": whole.cpu_s / events * 1e6,
        f"{name}_used_memory_mb": used / _MB,
        f"{name}_used_memory_bytes": used,
        f"{name}_keys": int(client.dbsize()) - keys_before,
    }


def _order_state(
    stack: LocalStack, state: Path, events: int, expected: Mapping[str, State], sample: int
) -> tuple[dict[str, Any], Verdict]:
    options = OrderStateOptions(
        topics=[TOPIC], dead_letter_topic=f"{TOPIC}.dlq", notifications_topic=NOTIFICATIONS
    )
    prefix = f"scale-{events}"
    out = _spark_run(stack, state, prefix, "order_state", options, events)
    client = redis_client(stack.redis_url)
    keys = _live_keys(client, "order_state", prefix)
    verdict = compare(expected, redis_states(client, f"{keys.base}:t:orders"))
    kinds = memory_per_key(client, keys.base, ("t",), sample)
    out.update(
        order_state_entities=len(expected),
        order_state_bytes_per_entity=per_entity(
            out["order_state_used_memory_bytes"], len(expected)
        ),
        order_state_memory_usage_avg=_sampled_average(kinds, "t"),
        order_state_check=str(verdict),
    )
    return out, verdict


def _expirable(oracle: WindowOracle, watermark: int) -> set[tuple[str, int, str]]:
    """The oracle's buckets whose retention ``watermark`` has passed (the closer deletes them).

    The closer runs after a micro-batch, so the last batch's may not have run when the
    catch-up ends: such a bucket may be in Redis (then equal to the oracle's) or not.
    """
    retention = SALES_WINDOWS.event_time.retention_ms if SALES_WINDOWS.event_time else 0
    windows = {w.name: w for w in SalesWindows.windows}
    return {
        (name, start, group)
        for name, start, group in oracle.buckets
        if windows[name].ends(start)[-1] + retention <= watermark
    }


def _sales_windows(
    stack: LocalStack, state: Path, events: int, oracle: WindowOracle, sample: int
) -> tuple[dict[str, Any], Verdict]:
    """sales_windows; its buckets against the oracle's, those past their retention aside."""
    prefix = f"scale-{events}"
    options = ProcessorOptions(topics=[TOPIC])
    out = _spark_run(stack, state, prefix, "sales_windows", options, events)
    client = redis_client(stack.redis_url)
    keys = _live_keys(client, "sales_windows", prefix)
    got = _bucket_dump(client, keys)
    lateness = SALES_WINDOWS.event_time.lateness_ms if SALES_WINDOWS.event_time else 0
    watermark = generation_watermark(client, keys, lateness)
    fields = [position_field(TOPIC, p) for p in range(ORDERS_TOPIC.partitions)]
    expected_watermark = watermark_of(oracle.clocks, lateness, fields)
    expirable = _expirable(oracle, expected_watermark or 0)
    # An expirable bucket the closer has deleted counts as equal; one still there is compared.
    filled = {**{k: oracle.buckets[k] for k in expirable if k not in got}, **got}
    verdict = compare(_named(oracle.buckets), _named(filled))
    if watermark != expected_watermark:  # the clocks differ: count it as a difference
        verdict = Verdict(verdict.expected, verdict.missing, verdict.extra, verdict.different + 1)
        print(f"  sales_windows' watermark {watermark} != the oracle's {expected_watermark}")
    kinds = memory_per_key(client, keys.base, ("w", "wd"), sample)
    sketches = sum(int(f["keys"]) for kind, f in kinds.items() if kind.startswith("wd:"))
    expired = sum(1 for k in expirable if k not in got)
    out.update(
        sales_windows_buckets=len(got),
        sales_windows_sketches=sketches,
        sales_windows_expired=expired,
        sales_windows_buckets_sketches=f"{len(got):,} / {sketches:,}",
        sales_windows_bytes_per_bucket=per_entity(out["sales_windows_used_memory_bytes"], len(got)),
        sales_windows_bucket_usage_avg=_sampled_average(kinds, "w"),
        sales_windows_sketch_usage_avg=_sampled_average(kinds, "wd"),
        sales_windows_check=str(verdict).replace("states", "buckets")
        + f", {expired:,} expired by retention",
    )
    return out, verdict


def _disk_bytes(folder: Path) -> int:
    """Bytes of the files under every ``rocksdb`` folder below ``folder`` (the stores)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and "rocksdb" in f.parts)


def _kafka_streams(
    stack: LocalStack,
    work: Path,
    ends: Mapping[tuple[str, int], int],
    expected: Mapping[str, State],
    heap: str,
) -> tuple[dict[str, Any], Verdict | None]:
    """The Kafka Streams peer in an application of its own on the whole topic."""
    engine = next(e for e in ENGINES if e.name == "kafka-streams")
    events = sum(ends.values())
    job = Job(
        stack.bootstrap_servers,
        stack.redis_url,
        TOPIC,
        ends,
        events,
        work / f"kafka-streams-{events}",
        run=f"-scale-{events}",
        java_heap=heap,
    )
    missing = engine.missing(job)
    if missing:
        return {"kafka_streams_check": f"skipped: {missing}"}, None
    processes, progress = engine.processes(job)
    measured = measure(processes, progress, job.partition_ends, engine.label)
    verdict = compare(expected, engine.states(job))
    disk = _disk_bytes(job.work / engine.name / "state")
    return {
        "kafka_streams_rate_steady": measured.rate_steady,
        "kafka_streams_rate_wall": measured.rate_wall,
        "kafka_streams_peak_rss_mb": measured.peak_rss_mb,
        "kafka_streams_cpu_s_per_million": measured.cpu_s / events * 1e6,
        "kafka_streams_disk_mb": disk / _MB,
        "kafka_streams_disk_bytes": disk,
        "kafka_streams_disk_bytes_per_entity": per_entity(disk, len(expected)),
        "kafka_streams_check": str(verdict),
    }, verdict


def _ends(bootstrap: str) -> dict[tuple[str, int], int]:
    offsets = LogOffsets({"bootstrap.servers": bootstrap})
    try:
        return offsets.end_offsets([(TOPIC, p) for p in range(ORDERS_TOPIC.partitions)])
    finally:
        offsets.close()


def _one_size(
    stack: LocalStack, work: Path, events: int, args: argparse.Namespace
) -> tuple[dict[str, Any], bool]:
    """Every run at one size; its figures and whether every check passed."""
    out: dict[str, Any] = {"events": events, "load_before": os.getloadavg()[0]}
    out["load_avg_before"] = list(os.getloadavg())
    started = time.monotonic()
    print(f"oracle: folding {events:,} events the plain way ...", flush=True)
    states, windows = _oracle(stack.bootstrap_servers)
    out["oracle_s"] = time.monotonic() - started
    redis_client(stack.redis_url).flushdb()
    state = work / f"size-{events}"
    figures, verdict = _order_state(stack, state, events, states, args.sample)
    out.update(figures)
    checks = [verdict]
    figures, verdict = _sales_windows(stack, state, events, windows, args.sample)
    out.update(figures)
    checks.append(verdict)
    del windows
    if not args.skip_kafka_streams:
        ends = _ends(stack.bootstrap_servers)
        try:
            figures, peer = _kafka_streams(stack, work, ends, states, args.java_heap)
        except RuntimeError as exc:  # the peer failed to run: refold's side stands
            figures, peer = {"kafka_streams_check": f"not run: {str(exc)[:200]}"}, None
        out.update(figures)
        if peer is not None:
            checks.append(peer)
    out["load_avg_after"] = list(os.getloadavg())
    out["load_after"] = out["load_avg_after"][0]
    for key in ("order_state_check", "sales_windows_check", "kafka_streams_check"):
        if key in out:
            print(f"  {events:,}: {key.removesuffix('_check')} {out[key]}", flush=True)
    return out, all(v.ok for v in checks)


def _write(results: list[dict[str, Any]]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps({"cores": os.cpu_count(), "sizes": results, "ratios": ratios(results)}, indent=2)
    )


def _sizes(text: str) -> list[int]:
    sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] <= 0:
        msg = f"sizes must be positive: {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return sizes


def main(argv: list[str] | None = None) -> int:
    """``python -m bench scale``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=[1_000_000, 4_000_000, 10_000_000],
        help="order events at each step, comma-separated (default 1000000,4000000,10000000)",
    )
    parser.add_argument("--sample", type=int, default=1000, help="keys of MEMORY USAGE per kind")
    parser.add_argument(
        "--skip-kafka-streams", action="store_true", help="refold's side only (no JVM peer)"
    )
    parser.add_argument("--java-heap", default="3g", help="the Kafka Streams peer's -Xmx")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the stack's and processors' state and logs here (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    passed = True
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-scale-")
    ) as tmp:
        work = Path(tmp)
        with LocalStack(work / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            ensure_topics(
                {"bootstrap.servers": stack.bootstrap_servers},
                [
                    ORDERS_TOPIC,
                    TopicSpec(f"{TOPIC}.dlq", 1, "(key)", ("(any)",)),
                    effects_spec(NOTIFICATIONS),
                ],
            )
            for events in produce_order_steps(stack.bootstrap_servers, args.sizes):
                figures, ok = _one_size(stack, work, events, args)
                results.append(figures)
                passed = passed and ok
                _write(results)  # after each size: a long run's first sizes are kept
    print("\n" + table(results))
    print(f"\nresults written to {RESULTS}")
    if not passed:
        print("FAILED: a final state differs from the oracle (see the table's checks)")
        return 1
    return 0
