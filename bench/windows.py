"""Event-time windows against the entity fold, in one run over the same order events.

``python -m bench windows`` (alone: its own stack and backlog) or the windows section of
``python -m bench`` (``--skip-windows`` leaves it out; it reuses that run's order_state
catch-up as its baseline). Over one backlog of order events:

1. **entity fold**: order_state catching up (the baseline; steady state after batch 0);
2. **additive windows**: sales_windows catching up on the same records. It counts only the
   ``OrderPaid`` (about one record in nine) into three windows per currency and passes the
   rest by, so its events/s, like order_state's, count every record read. Target: at least
   1.5x order_state's steady events/s (reported, not asserted). Its driver emits every window
   the watermark passed between micro-batches, so its rate depends on how much event time a
   batch spans: the simulated orders come one per ~200 ms of event time, so a 200k batch
   spans ~11 hours and closes ~16k windows (3 currencies, per minute, hopping every minute,
   sliding every 10 s). The table shows how many it emitted;
3. **Spark-native window**: sales_native, the DataFrame processor twin of sales_windows'
   ``per_minute`` window, catching up on the same records as a processor does (its events
   decoded in ``mapInArrow``, then Spark's ``withWatermark`` + ``groupBy(window, currency)``
   with count, sum, min and max, update mode, each batch's changed windows upserted as JSON
   rows with the batch's positions in one guarded transaction); its rows are compared with
   sales_windows' ``per_minute`` buckets;
4. **HyperLogLogs**: unique_visitors (hourly distinct visitors, overall and per device) on a
   clickstream backlog, when there is one;
5. **Redis memory**: ``MEMORY USAGE`` of a sample of each kind of key the runs left: window
   buckets (``w:``) per window, HyperLogLogs (``wd:``), and sales_native's rows (``t:``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel

from bench.backlog import ORDERS_TOPIC, PAGEVIEWS_TOPIC, TOPICS, produce_clickstream, produce_orders
from bench.catch_up import CatchUp, ProcessorCatchUp, Run, Watched, run_catch_up
from bench.envelope_only import envelope_only, envelope_rows
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.fold.windows import windows_topic
from refold.processors.order_state.config import OrderStateOptions

__all__ = [
    "RESULTS",
    "catch_up_alone",
    "catch_up_run",
    "main",
    "measure_windows",
    "memory_per_key",
    "window_rows",
]

RESULTS = Path(__file__).parent / "results" / "windows.json"
SOURCE_FORMAT = os.environ.get("REFOLD_SOURCE_FORMAT", "")
TARGET_RATIO = 1.5  # sales_windows / order_state, steady events/s
NATIVE = "sales_native"
_WEB_SHARE = 0.3  # web events per order event, as the apps run of python -m bench


def _extra() -> dict[str, str]:
    return {"source_format": SOURCE_FORMAT} if SOURCE_FORMAT else {}


def catch_up_alone(
    stack: LocalStack,
    state: Path,
    prefix: str,
    name: str,
    options: BaseModel,
    total: int,
) -> tuple[ProcessorCatchUp, float]:
    """One processor catching up alone (``--available-now``); its figures and peak RSS (MB)."""
    result = catch_up_run(stack, state, prefix, name, options, total)
    return result.processors[name], result.peak_rss_mb


def catch_up_run(
    stack: LocalStack,
    state: Path,
    prefix: str,
    name: str,
    options: BaseModel,
    total: int,
) -> CatchUp:
    """:func:`catch_up_alone`'s whole measurement (CPU time and Pss too)."""
    launcher = ProcessLauncher(
        KafkaSettings(bootstrap_servers=stack.bootstrap_servers),
        RedisSettings(url=stack.redis_url, key_prefix=prefix),
        SparkSettings(),
        state,
        {name: options},
    )
    client = redis_client(stack.redis_url)
    run = Run(
        GroupProcess(
            launcher.argv([name], available_now=True),
            launcher.env(),
            state / "logs" / f"{prefix}-{name}.log",
        ),
        (Watched(name, GenerationRegistry.of(client, name, prefix), total),),
    )
    return run_catch_up([run], f"{name} catch-up")


def order_state_baseline(
    stack: LocalStack, state: Path, prefix: str, total: int
) -> tuple[ProcessorCatchUp, float]:
    """order_state (the entity fold) catching up on :data:`ORDERS_TOPIC`."""
    topic = ORDERS_TOPIC.name
    options = OrderStateOptions(
        topics=[topic],
        dead_letter_topic=f"{topic}.dlq",
        notifications_topic=f"{topic}.notifications",
        **_extra(),
    )
    return catch_up_alone(stack, state, prefix, "order_state", options, total)


def _kind(key: str, base: str) -> str:
    """``w:<window>``, ``wd:<window>:<measure>`` or ``t:<table>`` of a key under ``base``."""
    rest = key[len(base) + 1 :]
    namespace, _, tail = rest.partition(":")
    parts = tail.split(":")
    return f"wd:{parts[0]}:{parts[1]}" if namespace == "wd" else f"{namespace}:{parts[0]}"


def memory_per_key(
    client: redis.Redis, base: str, namespaces: Sequence[str], sample: int, seed: int = 1
) -> dict[str, dict[str, float]]:
    """``MEMORY USAGE`` of up to ``sample`` keys of each kind under ``base`` (bytes).

    Args:
        client: Redis.
        base: Key base (a generation's ``GenerationKeys.base``, or any prefix).
        namespaces: ``w`` (window buckets, by window), ``wd`` (HyperLogLogs, by window and
            measure) and/or ``t`` (table rows, by table).
        sample: Keys measured per kind (picked at random among all of that kind).
        seed: Of the sample.

    Returns:
        Per kind: ``keys`` (all of that kind), ``sampled``, ``avg_bytes``, ``min_bytes``,
        ``max_bytes``, and for HyperLogLogs ``dense`` (sampled sketches in the dense encoding).
    """
    kinds: dict[str, list[str]] = defaultdict(list)
    for namespace in namespaces:
        for raw in client.scan_iter(match=f"{base}:{namespace}:*", count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            kinds[_kind(key, base)].append(key)
    rng = random.Random(seed)  # a sample, not security
    out: dict[str, dict[str, float]] = {}
    for kind, keys in sorted(kinds.items()):
        picked = rng.sample(keys, min(sample, len(keys)))
        pipe = client.pipeline(transaction=False)
        for key in picked:
            pipe.memory_usage(key, samples=0)
            if kind.startswith("wd:"):
                pipe.getrange(key, 4, 4)  # HyperLogLog header "HYLL" + encoding: 0 dense
        answers = pipe.execute()
        step = 2 if kind.startswith("wd:") else 1
        sizes = [int(a or 0) for a in answers[::step]]
        figures: dict[str, float] = {
            "keys": len(keys),
            "sampled": len(picked),
            "avg_bytes": sum(sizes) / len(sizes),
            "min_bytes": min(sizes),
            "max_bytes": max(sizes),
        }
        if step == 2:
            figures["dense"] = sum(1 for enc in answers[1::2] if enc == b"\x00")
        out[kind] = figures
    return out


def _live_base(client: redis.Redis, name: str, prefix: str) -> str:
    registry = GenerationRegistry.of(client, name, prefix)
    live = registry.live()
    if live is None:
        msg = f"{name} has no live generation under {prefix!r}"
        raise RuntimeError(msg)
    return registry.keys(live).base


_COMPARED = ("count", "sum:amount_minor", "min:amount_minor", "max:amount_minor")


def compare_native(client: redis.Redis, native_base: str, sales_base: str) -> dict[str, int]:
    """sales_native's rows against sales_windows' ``per_minute`` buckets.

    Both count the same ``OrderPaid``; a bucket sales_windows has expired (retention, on its
    watermark) is counted apart, not as a difference.

    Returns:
        ``compared``, ``differ`` (count, sum, min or max unequal) and ``expired``.
    """
    names = [raw.decode() for raw in client.scan_iter(match=f"{native_base}:t:*", count=1000)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    rows = [json.loads(raw) for raw in pipe.execute()]
    for row in rows:
        pipe.hgetall(f"{sales_base}:w:per_minute:{row['start']}:{row['group']}")
    buckets = pipe.execute()
    out = {"compared": 0, "differ": 0, "expired": 0}
    for row, bucket in zip(rows, buckets, strict=True):
        if not bucket:
            out["expired"] += 1
            continue
        out["compared"] += 1
        if any(int(row[f]) != int(bucket[f.encode()]) for f in _COMPARED):
            out["differ"] += 1
    return out


def _ratio(ours: float, theirs: float) -> float | None:
    """``ours / theirs``; None when either has no figure (e.g. no steady state: one batch)."""
    return ours / theirs if ours and theirs else None


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _summary(run: ProcessorCatchUp, rss_mb: float) -> dict[str, float]:
    return {**run.summary(), "peak_rss_mb": rss_mb}


def measure_windows(
    stack: LocalStack,
    state: Path,
    orders: int,
    baseline: Mapping[str, float],
    pageviews: int = 0,
    *,
    prefix: str = "bench-windows",
    sample: int = 200,
    native: bool = True,
) -> dict[str, Any]:
    """sales_windows, sales_native and unique_visitors, and their Redis memory.

    Args:
        stack: The local stack, with the order backlog in :data:`ORDERS_TOPIC`.
        state: State directory (checkpoints; logs in ``logs/``).
        orders: Records in :data:`ORDERS_TOPIC`.
        baseline: order_state's catch-up figures on the same records (``rate_steady``,
            ``rate_wall``...).
        pageviews: Records in :data:`PAGEVIEWS_TOPIC` (0: no unique_visitors run).
        prefix: Redis key prefix of the window processors' generations.
        sample: Keys measured per kind of key.
        native: Run sales_native (the Spark-native window).
    """
    client = redis_client(stack.redis_url)
    out: dict[str, Any] = {"events": orders, "order_state": dict(baseline)}
    options = ProcessorOptions(topics=[ORDERS_TOPIC.name], **_extra())
    run, rss = catch_up_alone(stack, state, prefix, "sales_windows", options, orders)
    sales = out["sales_windows"] = _summary(run, rss)
    sales["windows_emitted"] = _records(stack, windows_topic("sales_windows"))
    base_steady, base_wall = baseline["rate_steady"], baseline["rate_wall"]
    out["ratio_steady"] = _ratio(sales["rate_steady"], base_steady)
    out["ratio_wall"] = _ratio(sales["rate_wall"], base_wall)
    out["target_met"] = None if out["ratio_steady"] is None else out["ratio_steady"] >= TARGET_RATIO
    if native:
        run, rss = catch_up_alone(stack, state, prefix, NATIVE, options, orders)
        result: dict[str, Any] = {**_summary(run, rss)}
        out["native"] = result
        result["ratio_steady"] = _ratio(result["rate_steady"], base_steady)
        result["ratio_wall"] = _ratio(result["rate_wall"], base_wall)
        result["ratio_sales_windows"] = _ratio(result["rate_steady"], sales["rate_steady"])
    if pageviews:
        options = ProcessorOptions(topics=[PAGEVIEWS_TOPIC.name], **_extra())
        run, rss = catch_up_alone(stack, state, prefix, "unique_visitors", options, pageviews)
        out["unique_visitors"] = _summary(run, rss)
    sales_base = _live_base(client, "sales_windows", prefix)
    native_base = _live_base(client, NATIVE, prefix) if native else ""
    if native:
        out["native"]["agreement"] = compare_native(client, native_base, sales_base)
    memory: dict[str, Any] = {
        "sales_windows": memory_per_key(client, sales_base, ("w", "wd"), sample)
    }
    if pageviews:
        memory["unique_visitors"] = memory_per_key(
            client, _live_base(client, "unique_visitors", prefix), ("wd", "w"), sample
        )
    if native:
        memory["native"] = memory_per_key(client, native_base, ("t",), sample)
    out["memory"] = memory
    return out


def _rate(figures: Mapping[str, float]) -> str:
    steady = figures["rate_steady"]
    return (
        f"{f'{steady:,.0f} ev/s' if steady else 'n/a (one batch)'} "
        f"(incl. start-up {figures['rate_wall']:,.0f} ev/s, "
        f"{figures['wall_s']:.1f} s; peak RSS {figures['peak_rss_mb']:,.0f} MB)"
    )


def _average(kinds: Mapping[str, Mapping[str, float]], namespace: str) -> tuple[float, int, int]:
    """Average bytes per key over the sampled keys of ``namespace``, sampled and total keys."""
    chosen = [f for k, f in kinds.items() if k.startswith(f"{namespace}:")]
    sampled = sum(int(f["sampled"]) for f in chosen)
    total = sum(f["avg_bytes"] * f["sampled"] for f in chosen)
    return (total / sampled if sampled else 0.0), sampled, sum(int(f["keys"]) for f in chosen)


def _memory_rows(memory: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[tuple[str, str]]:
    rows = []
    labels = {"sales_windows": "sales_windows", "unique_visitors": "unique_visitors"}
    for processor, label in labels.items():
        kinds = memory.get(processor)
        if not kinds:
            continue
        for namespace, what in (("w", "window bucket (hash)"), ("wd", "HyperLogLog")):
            average, sampled, keys = _average(kinds, namespace)
            if not sampled:
                continue
            detail = ", ".join(
                f"{kind.split(':', 1)[1]} {f['avg_bytes']:,.0f}"
                + (
                    f" ({int(f['dense'])}/{int(f['sampled'])} dense; "
                    f"{f['min_bytes']:,.0f}-{f['max_bytes']:,.0f})"
                    if "dense" in f
                    else ""
                )
                for kind, f in kinds.items()
                if kind.startswith(f"{namespace}:")
            )
            rows.append(
                (
                    f"redis per {what}, {label}",
                    f"avg {average:,.0f} B over {sampled:,} of {keys:,} keys ({detail})",
                )
            )
    native = memory.get("native")
    if native:
        average, sampled, keys = _average(native, "t")
        rows.append(
            (
                "redis per window row (JSON), sales_native",
                f"avg {average:,.0f} B over {sampled:,} of {keys:,} keys",
            )
        )
    return rows


def window_rows(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The windows section of the benchmark's table."""
    base, sales = result["order_state"], result["sales_windows"]
    met = result["target_met"]
    verdict = "n/a (no steady state)" if met is None else "met" if met else "NOT met"
    rows = [
        ("windows: order events (same backlog)", f"{result['events']:,}"),
        ("order_state (entity fold), steady", _rate(base)),
        ("sales_windows (additive windows), steady", _rate(sales)),
        (
            "sales_windows: closed windows emitted",
            f"{sales['windows_emitted']:,.0f} "
            f"(one per {result['events'] / max(sales['windows_emitted'], 1):,.1f} events)",
        ),
        (
            "sales_windows / order_state, steady (wall)",
            f"{_times(result['ratio_steady'])} ({_times(result['ratio_wall'])}); "
            f"target >= {TARGET_RATIO}x steady: {verdict}",
        ),
    ]
    native = result.get("native")
    if native:
        rows += [
            ("sales_native (Spark-native window), steady", _rate(native)),
            (
                "sales_native / order_state, steady (wall)",
                f"{_times(native['ratio_steady'])} ({_times(native['ratio_wall'])})",
            ),
            (
                "sales_native / sales_windows, steady",
                _times(native["ratio_sales_windows"]),
            ),
        ]
        agreement = native.get("agreement")
        if agreement:
            rows.append(
                (
                    "sales_native = sales_windows per_minute",
                    f"{agreement['compared'] - agreement['differ']:,} of "
                    f"{agreement['compared']:,} windows equal (count, sum, min, max); "
                    f"{agreement['expired']:,} expired in sales_windows",
                )
            )
    visitors = result.get("unique_visitors")
    if visitors:
        rows.append(
            (f"unique_visitors (HLL), {visitors['events']:,.0f} page views", _rate(visitors))
        )
    rows += _memory_rows(result["memory"])
    return rows


def _table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _records(stack: LocalStack, topic: str) -> int:
    """Records in ``topic`` (the sum of its partitions' end offsets)."""
    offsets = LogOffsets({"bootstrap.servers": stack.bootstrap_servers})
    try:
        ends = offsets.end_offsets([(topic, p) for p in offsets.partitions(topic)])
    finally:
        offsets.close()
    return sum(ends.values())


def _ends(stack: LocalStack, topics: Sequence[TopicSpec]) -> dict[str, int]:
    offsets = LogOffsets({"bootstrap.servers": stack.bootstrap_servers})
    try:
        ends = offsets.end_offsets([(t.name, p) for t in topics for p in range(t.partitions)])
    finally:
        offsets.close()
    totals: dict[str, int] = defaultdict(int)
    for (topic, _partition), end in ends.items():
        totals[topic] += end
    return dict(totals)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench windows``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench windows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=500_000, help="order events")
    parser.add_argument(
        "--web-events",
        type=int,
        help=f"clickstream for unique_visitors (default {_WEB_SHARE:.0%}% of --events; 0: none)",
    )
    parser.add_argument("--sample", type=int, default=200, help="keys measured per kind")
    parser.add_argument(
        "--skip-native", action="store_true", help="no sales_native (the Spark-native window)"
    )
    parser.add_argument(
        "--envelope-records",
        type=int,
        default=200_000,
        help="records applied in-process, without Spark, as order_state and as sales_windows "
        "(0: skip)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the stack's and processors' state and logs here (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    web = args.web_events if args.web_events is not None else int(args.events * _WEB_SHARE)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-windows-")
    ) as tmp:
        state = Path(tmp)
        with LocalStack(state / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            ensure_topics(
                {"bootstrap.servers": stack.bootstrap_servers},
                [*TOPICS, TopicSpec(f"{ORDERS_TOPIC.name}.dlq", 1, "(key)", ("(any)",))],
            )
            produce_orders(stack.bootstrap_servers, args.events)
            if web:
                produce_clickstream(stack.bootstrap_servers, web, args.events)
            ends = _ends(stack, TOPICS)
            orders, pageviews = ends[ORDERS_TOPIC.name], ends.get(PAGEVIEWS_TOPIC.name, 0)
            print(f"backlog: {orders:,} order events, {pageviews:,} page views", flush=True)
            envelope = None
            if args.envelope_records:
                envelope = envelope_only(
                    stack.bootstrap_servers,
                    stack.redis_url,
                    ORDERS_TOPIC.name,
                    args.envelope_records,
                )
            run, rss = order_state_baseline(stack, state, "bench-windows-base", orders)
            result = measure_windows(
                stack,
                state,
                orders,
                _summary(run, rss),
                pageviews,
                sample=args.sample,
                native=not args.skip_native,
            )
    if envelope is not None:
        result["envelope_only"] = envelope
    rows = [("machine", f"{os.cpu_count()} cores"), *window_rows(result)]
    if envelope is not None:
        rows += envelope_rows(envelope)
    print("\n" + _table(rows))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\nresults written to {RESULTS}")
    return 0
