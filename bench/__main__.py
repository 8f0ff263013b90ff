"""``python -m bench`` (``make bench``): throughput and latency of refold on the local stack.

One run, on a private local stack, over the same pre-produced order events:
1. baseline: plain Python, one process per core, each assigned its own partitions, doing the
   same decode -> fold -> exactly-once Redis write (FoldWriter) as the processor;
2. the Spark order_state processor catching up on the same backlog (its own generation);
3. ``replay --to-earliest --execute`` of that processor: rebuild throughput of the shadow
   generation, and the cutover (the alias flip) as a reader sees it;
4. end-to-end latency (send -> applied in Redis) of the Spark processor at a steady rate.
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
from dataclasses import asdict
from pathlib import Path

import redis
from confluent_kafka import Producer
from tqdm import tqdm

from bench.baseline import BaselineResult, run_baseline
from bench.latency import LatencyResult, measure_latency
from bench.rebuild import measure_rebuild
from contracts.codec import EventCodec
from contracts.commerce import ORDERS
from contracts.kafka.admin import ensure_topics
from contracts.kafka.offsets import LogOffsets
from contracts.layout import StateLayout
from contracts.processors import ProcessLauncher
from contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from contracts.store.generations import GenerationRegistry
from contracts.topics import TopicSpec, dead_letter_spec, effects_spec
from deploy.local_stack import LocalStack, free_port
from deploy.processes import ProcessorProcess
from deploy.simulators.orders import OrderSimulator
from processors.order_state.config import OrderStateOptions
from processors.order_state.projection import DEFAULT_NOTIFICATIONS_TOPIC
from processors.runtime.envelope import FoldTarget

RESULTS = Path(__file__).parent / "results" / "latest.json"
SOURCE_FORMAT = os.environ.get("REFOLD_SOURCE_FORMAT", "")


def _produce(bootstrap: str, topic: str, events: int) -> int:
    codec = EventCodec()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "partitioner": "murmur2_random",
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    count = 0
    with tqdm(total=events, unit="ev", desc="producing", dynamic_ncols=True) as bar:
        for event_type, event in OrderSimulator(events // 9 + 1, seed=2026):
            if count >= events:
                break
            value = codec.encode(event_type, event, validated=True)
            while True:
                try:
                    producer.produce(topic, value, event["order_id"].encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
            if count % 10_000 == 0:
                producer.poll(0)
                bar.update(10_000)
        bar.update(count % 10_000)
    if producer.flush(120):
        msg = "the broker did not acknowledge every benchmark event"
        raise RuntimeError(msg)
    return count


def _launcher(
    bootstrap: str, redis_url: str, prefix: str, state: Path, topic: str, **extra: str
) -> ProcessLauncher:
    """order_state on ``topic`` with the benchmark's settings (the process contract)."""
    options = OrderStateOptions(
        topics=[topic],
        dead_letter_topic=f"{topic}.dlq",
        notifications_topic=f"{topic}.notifications",
        **({"source_format": SOURCE_FORMAT} if SOURCE_FORMAT else {}),
        **extra,  # type: ignore[arg-type]
    )
    return ProcessLauncher(
        KafkaSettings(bootstrap_servers=bootstrap),
        RedisSettings(url=redis_url, key_prefix=prefix),
        SparkSettings(),
        state,
        {"order_state": options},
    )


def _spark_catch_up(stack: LocalStack, topic: str, total: int, state: Path) -> dict[str, float]:
    prefix = "bench-spark"
    registry = GenerationRegistry(
        redis.Redis.from_url(stack.redis_url), StateLayout("order_state", prefix)
    )
    launcher = _launcher(stack.bootstrap_servers, stack.redis_url, prefix, state, topic)
    process = ProcessorProcess(
        launcher.argv(["order_state"], available_now=True),
        launcher.env(),
        state / "logs" / "spark-catch-up.log",
    )
    started = time.monotonic()
    process.start()
    first_write = None  # when the first task of batch 0 committed
    batch0_end = batch0_done = None  # when the last task of batch 0 committed, and the count
    with tqdm(total=total, unit="ev", desc="spark catch-up", dynamic_ncols=True) as bar:
        done = 0
        while True:
            live = registry.live()
            positions, batch = registry.positions(live) if live is not None else ({}, None)
            now = time.monotonic()
            count = sum(positions.values())
            if count > done:
                first_write = first_write or now
                # Batches run one after the other: batch 0 (JVM and Python worker warm-up)
                # ends with its last task's commit; steady state is measured from there.
                if batch == 0:
                    batch0_end, batch0_done = now, count
                done = count
            bar.n = done
            bar.refresh()
            if done >= total:
                break
            if not process.alive():
                msg = f"the processor exited early:\n{process.log_tail()}"
                raise RuntimeError(msg)
            time.sleep(0.02)
    finished = time.monotonic()
    process.stop()
    assert first_write is not None  # noqa: S101 - the loop ran until everything was applied
    if batch0_end is None or batch0_done is None or batch0_done >= total:
        batch0_end, batch0_done = finished, total  # one batch only: no steady state
    rest = total - batch0_done
    steady = rest / max(finished - batch0_end, 1e-9) if rest > 0 else 0.0
    return {
        "events": total,
        "wall_s": finished - started,
        "rate_wall": total / (finished - started),
        "batch0_events": batch0_done,
        "batch0_s": batch0_end - started,
        "rate_steady": steady,
        "startup_to_first_write_s": first_write - started,
    }


def _latency(
    stack: LocalStack, state: Path, rate: int, seconds: float, trigger: str
) -> LatencyResult:
    topic = "bench.latency"
    ensure_topics(
        {"bootstrap.servers": stack.bootstrap_servers},
        [TopicSpec(topic, ORDERS.partitions, "order_id", ORDERS.event_types)],
    )
    prefix = "bench-latency"
    client = redis.Redis.from_url(stack.redis_url)
    registry = GenerationRegistry(client, StateLayout("order_state", prefix))
    launcher = _launcher(
        stack.bootstrap_servers, stack.redis_url, prefix, state, topic, trigger_interval=trigger
    )
    process = ProcessorProcess(
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
            seconds=3,
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
        "--work-dir",
        type=Path,
        help="keep the stack's and processors' state and logs here (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args(argv)

    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-")
    ) as tmp:
        state = Path(tmp)
        with LocalStack(state / "stack", free_port(), free_port()) as stack:
            topic = "bench.orders"
            kafka = {"bootstrap.servers": stack.bootstrap_servers}
            ensure_topics(
                kafka,
                [
                    TopicSpec(topic, ORDERS.partitions, "order_id", ORDERS.event_types),
                    TopicSpec(f"{topic}.dlq", 1, "(key)", ("(any)",)),
                    dead_letter_spec("order_state"),
                    effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),
                ],
            )
            base: BaselineResult | None = None
            spark: dict[str, float] | None = None
            rebuild: dict[str, float] | None = None
            events = 0
            if not args.skip_throughput:
                events = _produce(stack.bootstrap_servers, topic, args.events)
                offsets = LogOffsets(kafka)
                ends = offsets.end_offsets([(topic, p) for p in range(ORDERS.partitions)])
                offsets.close()
                print(f"backlog: {sum(ends.values()):,} events in {len(ends)} partitions")
                target = FoldTarget(
                    "order_state",
                    1,
                    stack.redis_url,
                    "bench-baseline",
                    tuple(kafka.items()),
                    f"{topic}.dlq",
                )
                print(f"baseline: {args.processes} plain Python processes ...", flush=True)
                base = run_baseline(stack.bootstrap_servers, target, ends, args.processes)
                print(f"baseline: {base.rate:,.0f} events/s")
                spark = _spark_catch_up(stack, topic, sum(ends.values()), state)
                if not args.skip_rebuild:
                    print("replay: rebuilding the same backlog into a new generation ...")
                    rebuild = measure_rebuild(
                        stack.bootstrap_servers,
                        stack.redis_url,
                        "bench-spark",
                        _launcher(
                            stack.bootstrap_servers, stack.redis_url, "bench-spark", state, topic
                        ),
                        state,
                        batch=200_000,
                    )
            latency = None
            if not args.skip_latency:
                print(
                    f"latency: {args.rate:,} events/s for {args.latency_seconds:.0f} s ...",
                    flush=True,
                )
                latency = _latency(stack, state, args.rate, args.latency_seconds, args.trigger)
    table = _table(base, spark, rebuild, latency, events)
    print("\n" + table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "events": events,
                "cores": os.cpu_count(),
                "baseline": {**asdict(base), "rate": base.rate} if base else None,
                "spark": spark,
                "rebuild": rebuild,
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
