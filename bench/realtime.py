"""Spark's real-time mode against micro-batches: produce -> output topic latency, in one run.

``python -m bench realtime`` (its own stack). Spark 4.1 has a real-time mode: long-running
tasks, one per Kafka partition, records flowing with no batch boundary (``Trigger.RealTime``;
PySpark 4.1 has no Python trigger for it, so it is set on the JVM writer through py4j). It
accepts Spark's JVM Kafka source, stateless operators and the Kafka or ``foreach`` sinks, not
``foreachBatch`` (every refold fold). This measures what that buys on the paths refold could
move to it, each reading one topic and writing every record to another, at a fixed rate:

- ``jvm``: JVM source -> JVM Kafka sink (a stateless output stream: filter, project, Avro
  expressions);
- ``python``: JVM source -> a Python ``foreach`` writer producing with confluent-kafka (a
  webhook or insight sender written in Python);

each under ``Trigger.RealTime`` and under a processing-time trigger of 0 (micro-batches back
to back). Each record's value is its produce time; a consumer of the output topic takes
``now - value``. Rounds alternate the order. Prints a table and writes
``bench/results/realtime.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.settings import SparkSettings
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.runtime.spark import build_spark_session

__all__ = ["RESULTS", "main"]

RESULTS = Path(__file__).parent / "results" / "realtime.json"
VARIANTS = ("jvm realtime", "jvm micro-batch", "python realtime", "python micro-batch")


class _KafkaForeachWriter:
    """A Python ``foreach`` writer: each row's value produced to ``topic`` (executor side)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.producer: Producer | None = None

    def open(self, _partition_id: int, _epoch_id: int) -> bool:
        self.producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        return True

    def process(self, row: Any) -> None:
        if self.producer is None:
            msg = "process() before open()"
            raise RuntimeError(msg)
        self.producer.produce(self.topic, bytes(row.value))
        self.producer.poll(0)

    def close(self, _error: BaseException | None) -> None:
        if self.producer is not None:
            self.producer.flush(10)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def _latencies(bootstrap: str, topic: str, expected: int, timeout: float) -> Iterator[list[float]]:
    """Collect ``now - produce time`` (ms) of ``expected`` records of ``topic`` while inside."""
    found: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-bench",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    stop = threading.Event()

    def _consume() -> None:
        while not stop.is_set() and len(found) < expected:
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                found.append((time.time() - float(message.value() or b"0")) * 1000)

    thread = threading.Thread(target=_consume, daemon=True)
    thread.start()
    try:
        yield found
        thread.join(timeout)
    finally:
        stop.set()
        thread.join(5)
        consumer.close()


def measure(
    spark: Any, bootstrap: str, variant: str, args: argparse.Namespace, n: int
) -> dict[str, Any]:
    """One variant: its own topics and query; latency of the records after the warm-up."""
    source, out = f"bench.realtime.{n}.in", f"bench.realtime.{n}.out"
    ensure_topics(
        {"bootstrap.servers": bootstrap},
        [TopicSpec(t, args.partitions, "(key)", ("(any)",)) for t in (source, out)],
    )
    rows = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
    )
    writer = rows.writeStream.outputMode("update").option(
        "checkpointLocation", str(Path(args.state) / "checkpoints" / str(n))
    )
    engine, trigger = variant.split(" ", 1)
    if engine == "jvm":
        writer = writer.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        writer = writer.option("topic", out)
    else:
        writer = writer.foreach(_KafkaForeachWriter(bootstrap, out))
    triggers = spark._jvm.org.apache.spark.sql.streaming.Trigger  # noqa: SLF001 - no Python API
    chosen = (
        triggers.RealTime(args.epoch)
        if trigger == "realtime"
        else triggers.ProcessingTime("0 seconds")
    )
    writer._jwrite = writer._jwrite.trigger(chosen)  # noqa: SLF001 - PySpark 4.1 has no realTime=
    query = writer.start()
    warmup = int(args.rate * args.warmup_seconds)
    measured = int(args.rate * args.seconds)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        with _latencies(bootstrap, out, warmup + measured, timeout=60) as found:
            started = time.monotonic()
            for i in range(warmup + measured):
                due = started + i / args.rate
                while (wait := due - time.monotonic()) > 0:
                    time.sleep(min(wait, 0.005))
                producer.produce(source, str(time.time()).encode())
                producer.poll(0)
            producer.flush(30)
        failure = query.exception()
    finally:
        query.stop()
    kept = found[warmup:]
    if failure is not None or not kept:
        return {"variant": variant, "error": str(failure or "no record reached the output")}
    return {
        "variant": variant,
        "records": len(kept),
        "lost": measured - len(kept),
        "p50_ms": statistics.median(kept),
        "p99_ms": _percentile(kept, 0.99),
        "max_ms": max(kept),
    }


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"produce -> output topic, {args.rate} ev/s for {args.seconds:g} s after "
        f"{args.warmup_seconds:g} s of warm-up, {args.partitions} partitions, real-time "
        f"epoch {args.epoch}; ranges over {args.rounds} round(s)",
        f"{'path':<20} {'p50 ms':>14} {'p99 ms':>14} {'max ms':>14}  errors",
    ]
    for variant in VARIANTS:
        ran = [r for r in results if r["variant"] == variant]
        good = [r for r in ran if "error" not in r]

        def span(key: str, good: list[dict[str, Any]] = good) -> str:
            values = [r[key] for r in good]
            return f"{min(values):.0f}-{max(values):.0f}" if values else "-"

        errors = "; ".join(r["error"][:80] for r in ran if "error" in r)
        lines.append(
            f"{variant:<20} {span('p50_ms'):>14} {span('p99_ms'):>14} {span('max_ms'):>14}  "
            f"{errors or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench realtime``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench realtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rate", type=int, default=1000, help="events/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--epoch", default="5 seconds", help="real-time mode's checkpoint interval")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="refold-bench-realtime-") as tmp:
        args.state = tmp
        with LocalStack(
            Path(tmp) / "stack", free_port(), free_port(), redis_persistent=False
        ) as stack:
            # One task slot per partition and per sink task: real-time mode runs them all at once.
            spark = build_spark_session(
                "bench-realtime", SparkSettings(master=f"local[{2 * args.partitions}]")
            )
            n = 0
            for round_ in range(args.rounds):
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    n += 1
                    print(f"round {round_ + 1}: {variant}", flush=True)
                    results.append(measure(spark, stack.bootstrap_servers, variant, args, n))
            spark.stop()
    print("\n" + _table(results, args) + f"\nmachine: {os.cpu_count()} cores")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"results written to {RESULTS}")
    return 0
