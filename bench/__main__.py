"""``python -m bench`` (``make bench``): throughput and latency of refold on the local stack.

One run, on a private local stack, over the same pre-produced order events:
1. baseline: plain Python, one process per core, each assigned its own partitions, doing the
   same decode -> fold -> exactly-once Redis write (FoldWriter) as the processor;
2. the Spark order_state processor catching up on the same backlog (its own generation), with
   refold's Kafka source and again with Spark's own ``kafka`` source;
3. ``replay --to-earliest --execute`` of that processor: rebuild throughput of the shadow
   generation, and the cutover (the alias flip) as a reader sees it;
4. end-to-end latency (send -> applied in Redis) of the Spark processor at a steady rate;
5. the re-keyed customer_stats catching up on the same orders (the cost of re-keying);
6. order_state, customer_stats and session_stats (on a clickstream backlog too) catching up as
   one Spark application and as three: events/s and peak memory of each;
7. event-time windows on the same orders: sales_windows (additive buckets) and sales_native
   (Spark's own window, a DataFrame processor) against order_state, and the Redis memory per
   window bucket, HyperLogLog and row
   (``bench/windows.py``; ``python -m bench windows`` runs this part alone, on its own backlog).
Parts run alone, each on a private stack of its own: ``python -m bench archive``,
``cold-tier`` (a rebuild's read and fold from the archive against from Kafka), ``webhooks``,
``serving`` (the HTTP services: single-key reads against Redis, batched ingest against the SDK;
``bench/serving.py``), ``cluster`` (the entity fold on a local Redis Cluster against one
redis-server, and failover; ``bench/redis_cluster.py``), ``realtime`` (Spark's real-time
mode against micro-batches), ``peers`` (refold side by side with Quix Streams, Bytewax,
Kafka Streams and Flink on one backlog; ``bench/peers/``, ``make bench-peers``) and ``scale``
(the scale curve: order_state, sales_windows and the Kafka Streams peer at 1M, 4M and 10M
events: events/s, peak memory, bytes per entity in Redis and on disk; ``bench/scale.py``).
Prints a table and writes ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.backlog import (
    CUSTOMERS_TOPIC,
    EMPTY_CUSTOMERS_TOPIC,
    ORDERS_TOPIC,
    PAGEVIEWS_TOPIC,
    SEARCHES_TOPIC,
    TOPICS,
    produce_clickstream,
    produce_orders,
)
from bench.baseline import BaselineResult, run_baseline
from bench.catch_up import CatchUp, ProcessorCatchUp, Run, Watched, run_catch_up
from bench.latency import LatencyResult, measure_latency
from bench.rebuild import measure_rebuild
from bench.windows import measure_windows, window_rows
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec, dead_letter_spec, effects_spec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import DEFAULT_NOTIFICATIONS_TOPIC
from refold.processors.runtime.envelope import FoldTarget

RESULTS = Path(__file__).parent / "results" / "latest.json"
SOURCE_FORMAT = os.environ.get("REFOLD_SOURCE_FORMAT", "")


# The three reference processors, in the order the one-application run names them.
_APPS = ("order_state", "customer_stats", "session_stats")
# Web events of the clickstream backlog per order event (``--web-events`` overrides it).
_WEB_SHARE = 0.3


def _order_state(topic: str, **extra: str) -> OrderStateOptions:
    """order_state's options on ``topic`` with the benchmark's settings."""
    chosen: dict[str, str] = {"source_format": SOURCE_FORMAT} if SOURCE_FORMAT else {}
    return OrderStateOptions(
        topics=[topic],
        dead_letter_topic=f"{topic}.dlq",
        notifications_topic=f"{topic}.notifications",
        **{**chosen, **extra},
    )


# The baseline's job (bench/baseline.py): the fold and its shipping notices, without the
# status-change stream, which neither it nor any peer publishes (~a third of the events become
# an Avro record each, checked against its contract and sent in Kafka transactions; what that
# costs: docs/performance.md). The catch-ups compared with the baseline run the same job.
_AS_THE_BASELINE = {"changes_topic": ""}


def _options(topics: Sequence[TopicSpec]) -> ProcessorOptions:
    """Options of a processor without options of its own, on the benchmark's ``topics``."""
    return ProcessorOptions(
        topics=[t.name for t in topics],
        **({"source_format": SOURCE_FORMAT} if SOURCE_FORMAT else {}),
    )


def _launcher(
    stack: LocalStack, prefix: str, state: Path, options: Mapping[str, BaseModel]
) -> ProcessLauncher:
    """The process contract for ``options``' processors, with their state under ``prefix``."""
    return ProcessLauncher(
        KafkaSettings(bootstrap_servers=stack.bootstrap_servers),
        RedisSettings(url=stack.redis_url, key_prefix=prefix),
        SparkSettings(),
        state,
        options,
    )


def _catch_up(
    stack: LocalStack,
    state: Path,
    prefix: str,
    applications: Sequence[Sequence[str]],
    options: Mapping[str, BaseModel],
    totals: Mapping[str, int],
    desc: str,
) -> CatchUp:
    """Catch up with ``--available-now``: one process per entry of ``applications``, together.

    Args:
        stack: The local stack.
        state: State directory (checkpoints; logs in ``logs/<prefix>-<names>.log``).
        prefix: Redis key prefix of the run (fresh generations).
        applications: The processor names of each process.
        options: Every processor's options.
        totals: Records each processor has to apply.
        desc: Progress bar label.
    """
    launcher = _launcher(stack, prefix, state, options)
    client = redis_client(stack.redis_url)
    runs = [
        Run(
            GroupProcess(
                launcher.argv(list(names), available_now=True),
                launcher.env(),
                state / "logs" / f"{prefix}-{'+'.join(names)}.log",
            ),
            tuple(
                Watched(name, GenerationRegistry.of(client, name, prefix), totals[name])
                for name in names
            ),
        )
        for names in applications
    ]
    return run_catch_up(runs, desc)


def _ends(kafka: dict[str, str], topics: Sequence[TopicSpec]) -> dict[tuple[str, int], int]:
    """The log end of every partition of ``topics``."""
    offsets = LogOffsets(kafka)
    try:
        return offsets.end_offsets([(t.name, p) for t in topics for p in range(t.partitions)])
    finally:
        offsets.close()


def _rekeyed(
    stack: LocalStack, state: Path, orders: int, spark: ProcessorCatchUp
) -> dict[str, float]:
    """customer_stats (re-keyed) on the orders backlog alone, against order_state's run."""
    options = {"customer_stats": _options([ORDERS_TOPIC, EMPTY_CUSTOMERS_TOPIC])}
    run = _catch_up(
        stack,
        state / "rekey",
        "bench-rekey",
        [["customer_stats"]],
        options,
        {"customer_stats": orders},
        "re-keyed catch-up",
    )
    rekeyed = run.processors["customer_stats"]
    return {
        **rekeyed.summary(),
        "peak_rss_mb": run.peak_rss_mb,
        "ratio_steady": rekeyed.rate_steady / spark.rate_steady if spark.rate_steady else 0.0,
    }


def _other_source(
    stack: LocalStack, state: Path, orders: int, spark: ProcessorCatchUp
) -> dict[str, Any]:
    """order_state on the same backlog with the other Kafka source (docs/local-broker.md).

    The processor's default is refold's ranges source; this runs Spark's JVM ``kafka`` source
    (or, with ``REFOLD_SOURCE_FORMAT=kafka``, refold's) into generations of its own.
    """
    default = SOURCE_FORMAT or "refold_kafka_ranges"
    other = "refold_kafka_ranges" if default == "kafka" else "kafka"
    options = {
        "order_state": _order_state(ORDERS_TOPIC.name, source_format=other, **_AS_THE_BASELINE)
    }
    run = _catch_up(
        stack,
        state / "source",
        "bench-source",
        [["order_state"]],
        options,
        {"order_state": orders},
        f"{other} source catch-up",
    )
    result = run.processors["order_state"]
    return {
        **result.summary(),
        "default": default,
        "other": other,
        "peak_rss_mb": run.peak_rss_mb,
        "ratio_steady": result.rate_steady / spark.rate_steady if spark.rate_steady else 0.0,
        "ratio_wall": spark.done_s / result.done_s if result.done_s else 0.0,
    }


def _applications(stack: LocalStack, state: Path, ends: Mapping[str, int]) -> dict[str, Any]:
    """The three processors as one Spark application, then as three applications."""
    orders = ends[ORDERS_TOPIC.name]
    totals = {
        "order_state": orders,
        "customer_stats": orders + ends[CUSTOMERS_TOPIC.name],
        "session_stats": ends[PAGEVIEWS_TOPIC.name] + ends[SEARCHES_TOPIC.name],
    }
    options: dict[str, BaseModel] = {
        "order_state": _order_state(ORDERS_TOPIC.name),
        "customer_stats": _options([ORDERS_TOPIC, CUSTOMERS_TOPIC]),
        "session_stats": _options([PAGEVIEWS_TOPIC, SEARCHES_TOPIC]),
    }
    one = _catch_up(
        stack, state / "one-app", "bench-one", [_APPS], options, totals, "1 application"
    )
    three = _catch_up(
        stack,
        state / "three-apps",
        "bench-three",
        [[name] for name in _APPS],
        options,
        totals,
        "3 applications",
    )
    return {
        "one": one.summary(),
        "three": three.summary(),
        "rate_ratio": one.rate_wall / three.rate_wall,
        "memory_ratio": one.peak_rss_mb / three.peak_rss_mb if three.peak_rss_mb else 0.0,
        "pss_ratio": one.peak_pss_mb / three.peak_pss_mb if three.peak_pss_mb else 0.0,
    }


def _latency(
    stack: LocalStack, state: Path, rate: int, seconds: float, trigger: str, warmup: float
) -> LatencyResult:
    topic = "bench.latency"
    ensure_topics(
        {"bootstrap.servers": stack.bootstrap_servers},
        [TopicSpec(topic, ORDERS.partitions, "order_id", ORDERS.event_types)],
    )
    prefix = "bench-latency"
    client = redis_client(stack.redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    launcher = _launcher(
        stack, prefix, state, {"order_state": _order_state(topic, trigger_interval=trigger)}
    )
    process = GroupProcess(
        launcher.argv(["order_state"]), launcher.env(), state / "logs" / "spark-latency.log"
    ).start()
    try:
        warm = measure_latency  # warm up JVM, workers and connections with a short burst
        deadline = time.monotonic() + 180
        while registry.live() is None:
            if time.monotonic() > deadline or not process.alive():
                msg = f"the latency processor did not start:\n{process.log_tail()}"
                raise RuntimeError(msg)
            time.sleep(0.2)
        live = registry.live()
        assert live is not None  # noqa: S101 - checked by the loop above
        warm(
            stack.bootstrap_servers,
            topic,
            registry,
            live,
            rate=rate,
            seconds=warmup,
            seed=1,
            order_prefix="warm-",
        )
        try:
            return measure_latency(
                stack.bootstrap_servers, topic, registry, live, rate=rate, seconds=seconds
            )
        except RuntimeError as exc:
            msg = f"{exc}; its log ends with:\n{process.log_tail()}"
            raise RuntimeError(msg) from exc
    finally:
        process.stop()


def _table(
    base: BaselineResult | None,
    spark: dict[str, float] | None,
    rebuild: dict[str, float] | None,
    latency: LatencyResult | None,
    events: int,
    rekeyed: dict[str, float] | None = None,
    applications: dict[str, Any] | None = None,
    windows: dict[str, Any] | None = None,
    sources: dict[str, Any] | None = None,
) -> str:
    rows = [("machine", f"{os.cpu_count()} cores, Python {platform.python_version()}")]
    if base is not None and spark is not None:
        ratio = spark["rate_steady"] / base.rate if base.rate else 0.0
        rows += [
            ("events", f"{events:,}"),
            (f"baseline: plain Python, {base.processes} processes", f"{base.rate:,.0f} ev/s"),
            (
                "spark processor, steady state (after batch 0)",
                f"{spark['rate_steady']:,.0f} ev/s",
            ),
            (
                "spark processor, incl. start-up",
                f"{spark['rate_wall']:,.0f} ev/s "
                f"({spark['wall_s']:.1f} s; batch 0: {spark['batch0_events']:,.0f} events, "
                f"done {spark['batch0_s']:.1f} s after start)",
            ),
            (
                f"spark processor, first {spark['first_events']:,.0f} events applied",
                f"{spark['first_events_s']:.1f} s after start",
            ),
            ("spark / baseline (steady)", f"{ratio:.0%}"),
        ]
    if spark is not None and rebuild is not None:
        ratio = rebuild["rate_steady"] / spark["rate_steady"] if spark["rate_steady"] else 0.0
        rows += [
            ("replay rebuild, steady state (after batch 0)", f"{rebuild['rate_steady']:,.0f} ev/s"),
            (
                "replay rebuild, incl. start-up",
                f"{rebuild['rate_wall']:,.0f} ev/s ({rebuild['wall_s']:.1f} s)",
            ),
            ("rebuild / live processor (steady)", f"{ratio:.0%}"),
            (
                "cutover: flip transaction / gap seen by a reader",
                f"{rebuild['flip_ms']:.1f} ms / {rebuild['reader_gap_ms']:.2f} ms",
            ),
        ]
    if sources is not None:
        other, default = sources["other"], sources["default"]
        rows += [
            (f"spark processor, {other} source, steady", f"{sources['rate_steady']:,.0f} ev/s"),
            (
                f"spark processor, {other} source, incl. start-up",
                f"{sources['rate_wall']:,.0f} ev/s ({sources['wall_s']:.1f} s)",
            ),
            (
                f"spark processor, {other} source, first {sources['first_events']:,.0f} events",
                f"{sources['first_events_s']:.1f} s after start",
            ),
            (
                f"{other} / {default} source: steady, incl. start-up",
                f"{sources['ratio_steady']:.0%}, {sources['ratio_wall']:.0%}",
            ),
        ]
    if rekeyed is not None:
        rows += [
            (
                f"re-keyed customer_stats, steady ({rekeyed['slots']:.0f} slots)",
                f"{rekeyed['rate_steady']:,.0f} ev/s",
            ),
            (
                "re-keyed customer_stats, incl. start-up",
                f"{rekeyed['rate_wall']:,.0f} ev/s ({rekeyed['wall_s']:.1f} s)",
            ),
            ("re-keyed / order_state (steady)", f"{rekeyed['ratio_steady']:.0%}"),
        ]
    if applications is not None:
        one, three = applications["one"], applications["three"]
        by_process = " + ".join(f"{mb:,.0f}" for mb in three["peak_rss_mb_by_process"])
        rows += [
            ("events, 3 processors (orders twice, web)", f"{one['events']:,.0f}"),
            (
                "3 processors, 1 application, until caught up",
                f"{one['rate_wall']:,.0f} ev/s ({one['wall_s']:.1f} s), "
                f"peak RSS {one['peak_rss_mb']:,.0f} MB (Pss {one['peak_pss_mb']:,.0f} MB)",
            ),
            (
                "3 processors, 3 applications, until caught up",
                f"{three['rate_wall']:,.0f} ev/s ({three['wall_s']:.1f} s), "
                f"peak RSS {three['peak_rss_mb']:,.0f} MB (Pss {three['peak_pss_mb']:,.0f} MB; "
                f"each at its peak: {by_process} MB)",
            ),
            (
                "1 / 3 applications: events/s, peak RSS (Pss)",
                f"{applications['rate_ratio']:.0%}, {applications['memory_ratio']:.0%} "
                f"({applications['pss_ratio']:.0%})",
            ),
        ]
    if windows is not None:
        rows += window_rows(windows)
    if latency is not None:
        rows.append(
            (
                f"latency at {latency.rate:,} ev/s ({latency.events:,} events)",
                f"p50 {latency.p50:.0f} ms, p95 {latency.p95:.0f} ms, "
                f"p99 {latency.p99:.0f} ms, max {latency.max:.0f} ms",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _throughput(stack: LocalStack, state: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The backlog runs: baseline, order_state, re-keyed, applications, replay."""
    kafka = {"bootstrap.servers": stack.bootstrap_servers}
    topic = ORDERS_TOPIC.name
    out: dict[str, Any] = {"events": produce_orders(stack.bootstrap_servers, args.events)}
    if not args.skip_apps or not args.skip_windows:
        web = args.web_events if args.web_events is not None else int(args.events * _WEB_SHARE)
        out["web_events"] = produce_clickstream(stack.bootstrap_servers, web, args.events)
    ends = _ends(kafka, TOPICS)
    orders = {tp: end for tp, end in ends.items() if tp[0] == topic}
    print(f"backlog: {sum(orders.values()):,} order events in {len(orders)} partitions")
    target = FoldTarget(
        "order_state", 1, stack.redis_url, "bench-baseline", tuple(kafka.items()), f"{topic}.dlq"
    )
    print(f"baseline: {args.processes} plain Python processes ...", flush=True)
    out["baseline"] = base = run_baseline(stack.bootstrap_servers, target, orders, args.processes)
    print(f"baseline: {base.rate:,.0f} events/s")
    options = {"order_state": _order_state(topic, **_AS_THE_BASELINE)}
    total = sum(orders.values())
    run = _catch_up(
        stack,
        state,
        "bench-spark",
        [["order_state"]],
        options,
        {"order_state": total},
        "spark catch-up",
    )
    spark = run.processors["order_state"]
    out["spark"] = {**spark.summary(), "peak_rss_mb": run.peak_rss_mb}
    if not args.skip_sources:
        out["source"] = _other_source(stack, state, total, spark)
    if not args.skip_rekey:
        out["rekey"] = _rekeyed(stack, state, total, spark)
    if not args.skip_windows:
        pageviews = sum(e for (n, _p), e in ends.items() if n == PAGEVIEWS_TOPIC.name)
        out["windows"] = measure_windows(stack, state, total, out["spark"], pageviews)
    if not args.skip_apps:
        totals = {t.name: sum(e for (n, _p), e in ends.items() if n == t.name) for t in TOPICS}
        out["applications"] = _applications(stack, state, totals)
    if not args.skip_rebuild:
        print("replay: rebuilding the same backlog into a new generation ...")
        out["rebuild"] = measure_rebuild(
            stack.bootstrap_servers,
            stack.redis_url,
            "bench-spark",
            _launcher(stack, "bench-spark", state, options),
            state,
            batch=200_000,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="backlog size")
    parser.add_argument(
        "--processes",
        type=int,
        default=os.cpu_count() or 2,
        help="baseline processes (default: one per core)",
    )
    parser.add_argument("--rate", type=int, default=5_000, help="latency run: events/s")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="latency run: seconds of the same rate before the measured ones (not counted; "
        "Spark's JIT takes ~35 s to settle at 5k events/s)",
    )
    parser.add_argument(
        "--trigger", default="100 milliseconds", help="processing-time trigger of the latency run"
    )
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-rebuild", action="store_true", help="no replay run")
    parser.add_argument(
        "--skip-throughput",
        action="store_true",
        help="only the latency run (no backlog, baseline or catch-up)",
    )
    parser.add_argument(
        "--skip-sources",
        action="store_true",
        help="no order_state catch-up with the other Kafka source (Spark's kafka vs refold's)",
    )
    parser.add_argument(
        "--skip-rekey", action="store_true", help="no re-keyed customer_stats catch-up"
    )
    parser.add_argument(
        "--skip-apps",
        action="store_true",
        help="no run of the three processors as one application and as three",
    )
    parser.add_argument(
        "--skip-windows",
        action="store_true",
        help="no event-time windows run (sales_windows, sales_native, unique_visitors)",
    )
    parser.add_argument(
        "--web-events",
        type=int,
        help=f"clickstream backlog of the apps run (default: {_WEB_SHARE:.0%}% of --events)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the stack's and processors' state and logs here (default: a temporary "
        "directory, removed at the end)",
    )
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["windows"]:  # the sub-command: the windows comparison alone
        from bench.windows import main as windows_main

        return windows_main(given[1:])
    if given[:1] == ["archive"]:  # the Parquet archive against the entity fold, alone
        from bench.archive import main as archive_main

        return archive_main(given[1:])
    if given[:1] == ["cold-tier"]:  # a rebuild's archive part against its Kafka part, alone
        from bench.cold_tier import main as cold_tier_main

        return cold_tier_main(given[1:])
    if given[:1] == ["webhooks"]:  # webhook deliveries/s to a local receiver, alone
        from bench.webhooks import main as webhooks_main

        return webhooks_main(given[1:])
    if given[:1] == ["realtime"]:  # Spark's real-time mode against micro-batches, alone
        from bench.realtime import main as realtime_main

        return realtime_main(given[1:])
    if given[:1] == ["cluster"]:  # the entity fold on a local Redis Cluster against one Redis
        from bench.redis_cluster import main as cluster_main

        return cluster_main(given[1:])
    if given[:1] == ["peers"]:  # refold side by side with Quix Streams, Bytewax, Kafka Streams
        from bench.peers.run import main as peers_main

        return peers_main(given[1:])
    if given[:1] == ["scale"]:  # the scale curve: 1M, 4M and 10M events
        from bench.scale import main as scale_main

        return scale_main(given[1:])
    if given[:1] == ["serving"]:  # the HTTP services: reads and ingest against Redis and the SDK
        from bench.serving import main as serving_main

        return serving_main(given[1:])
    args = parser.parse_args(given)

    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-")
    ) as tmp:
        state = Path(tmp)
        with LocalStack(state / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            ensure_topics(
                {"bootstrap.servers": stack.bootstrap_servers},
                [
                    *TOPICS,
                    TopicSpec(f"{ORDERS_TOPIC.name}.dlq", 1, "(key)", ("(any)",)),
                    *(dead_letter_spec(name) for name in _APPS),
                    effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),
                ],
            )
            if not args.skip_throughput:
                results.update(_throughput(stack, state, args))
            if not args.skip_latency:
                print(
                    f"latency: {args.rate:,} events/s for {args.latency_seconds:.0f} s ...",
                    flush=True,
                )
                results["latency"] = _latency(
                    stack,
                    state,
                    args.rate,
                    args.latency_seconds,
                    args.trigger,
                    args.warmup_seconds,
                )
    base, latency = results.get("baseline"), results.get("latency")
    table = _table(
        base,
        results.get("spark"),
        results.get("rebuild"),
        latency,
        results.get("events", 0),
        results.get("rekey"),
        results.get("applications"),
        results.get("windows"),
        results.get("source"),
    )
    print("\n" + table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "events": results.get("events", 0),
                "cores": os.cpu_count(),
                "baseline": {**asdict(base), "rate": base.rate} if base else None,
                "spark": results.get("spark"),
                "rebuild": results.get("rebuild"),
                "rekey": results.get("rekey"),
                "applications": results.get("applications"),
                "windows": results.get("windows"),
                "latency": asdict(latency) if latency else None,
                "trigger": args.trigger,
            },
            indent=2,
        )
    )
    print(f"\nresults written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
