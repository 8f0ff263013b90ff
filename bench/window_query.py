"""The Spark-native window query of ``python -m bench windows``, run as a process of its own.

``python -m bench.window_query --bootstrap HOST:PORT --topic T --redis-url URL ...`` reads the
topic with refold's Python source (``format("refold_kafka")``: records through Spark), decodes
each record with :class:`~contracts.codec.EventCodec` in ``mapInArrow`` (keeping ``OrderPaid``:
paid_at, currency, amount_minor), and runs Spark's own event-time aggregation::

    withWatermark("paid_at", "30 seconds")
    .groupBy(window("paid_at", "1 minute"), "currency")
    .agg(count, sum, min, max, avg)

in update mode, written by ``foreachBatch``: every updated window is upserted (HSET of the whole
aggregate, so a batch run again writes the same) into one Redis hash per window and currency,
``<prefix>:native:w:per_minute:<start ms>:<currency>``, under ``trigger(availableNow=True)``.

The same work as sales_windows' ``per_minute`` window, minus what Spark does not do here:
the hopping and sliding windows, the distinct payment methods, exactly-once writes under the
partition guards and the emission of each closed window. Prints one JSON line (the last line
of its output) with its timings and Spark's progress of every batch.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from contracts.codec import EventCodec
from contracts.errors import DeserializationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["OUTPUT_SCHEMA", "decode_payments", "main"]

_STARTED = time.monotonic()
OUTPUT_SCHEMA = "paid_at timestamp, currency string, amount_minor long"
_ARROW_OUT = pa.schema(
    [
        ("paid_at", pa.timestamp("us", tz="UTC")),
        ("currency", pa.string()),
        ("amount_minor", pa.int64()),
    ]
)
_RESULT_MARK = "window-query-result "


@functools.cache
def _codec() -> EventCodec:
    """One codec per Python worker (workers are reused across tasks)."""
    return EventCodec()


def _epoch_us(value: Any) -> int:
    """An Avro ``timestamp-millis`` as fastavro gives it (a datetime, or epoch ms) in us."""
    if isinstance(value, int):
        return value * 1000
    return int(value.timestamp() * 1_000_000)


def decode_payments(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: the ``OrderPaid`` among the records' values (executor side).

    Every record is decoded, as the processors do; undecodable ones are dropped (a processor
    would dead-letter them).
    """
    codec = _codec()
    for batch in batches:
        paid_at: list[int] = []
        currency: list[str] = []
        amount: list[int] = []
        for value in batch.column("value").to_pylist():
            try:
                event = codec.decode(value)
            except DeserializationError:
                continue
            if event.event_type != "OrderPaid":
                continue
            data = event.data
            paid_at.append(_epoch_us(data["paid_at"]))
            currency.append(str(data["currency"]))
            amount.append(int(data["amount_minor"]))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(paid_at, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(currency, pa.string()),
                pa.array(amount, pa.int64()),
            ],
            schema=_ARROW_OUT,
        )


class _Upsert:
    """``foreachBatch``: HSET every updated window's aggregate into its Redis hash (driver)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.rows = 0

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        import redis
        from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

        del batch_id
        rows = frame.select(
            F.unix_millis(F.col("window.start")).alias("start"),
            "currency",
            "count",
            "sum",
            "min",
            "max",
            "avg",
        ).collect()
        client = redis.Redis.from_url(self.redis_url)
        pipe = client.pipeline(transaction=False)
        for row in rows:
            key = f"{self.prefix}:native:w:per_minute:{row['start']}:{row['currency']}"
            pipe.hset(
                key,
                mapping={
                    "count": row["count"],
                    "sum:amount_minor": row["sum"],
                    "min:amount_minor": row["min"],
                    "max:amount_minor": row["max"],
                    "avg:amount_minor": repr(float(row["avg"])),
                },
            )
        pipe.execute()
        client.close()
        self.rows += len(rows)


def _batches(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "batch_id": p["batchId"],
            "rows": p["numInputRows"],
            "trigger_ms": p["durationMs"].get("triggerExecution", 0),
            "timestamp": p["timestamp"],
        }
        for p in progress
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the query until it has read what the topic held at its start."""
    parser = argparse.ArgumentParser(prog="python -m bench.window_query", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--key-prefix", default="bench-native")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--max-tasks", type=int, default=2)
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="cap per micro-batch (under availableNow PySpark 4.1 then stops after one batch)",
    )
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    from contracts.settings import SparkSettings
    from processors.runtime.spark import build_spark_session

    # bench/ is not an installed package: the JVM started below passes this on to the Python
    # workers, which import decode_payments from here.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    spark = build_spark_session("bench-window-query", SparkSettings())
    session_s = time.monotonic() - _STARTED
    reader = (
        spark.readStream.format("refold_kafka")
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("maxTasks", str(args.max_tasks))
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    windows = (
        reader.load()
        .select("value")
        .mapInArrow(decode_payments, OUTPUT_SCHEMA)
        .withWatermark("paid_at", "30 seconds")
        .groupBy(F.window("paid_at", "1 minute"), "currency")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("amount_minor").alias("sum"),
            F.min("amount_minor").alias("min"),
            F.max("amount_minor").alias("max"),
            F.avg("amount_minor").alias("avg"),
        )
    )
    upsert = _Upsert(args.redis_url, args.key_prefix)
    started = time.monotonic()
    query = (
        windows.writeStream.outputMode("update")
        .foreachBatch(upsert)
        .option("checkpointLocation", str(args.checkpoint))
        .queryName("bench_window_query")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    query_s, done_at = time.monotonic() - started, time.time()
    progress = _batches(list(query.recentProgress))
    result = {
        "session_s": session_s,
        "query_s": query_s,
        "done_at": done_at,
        "events": sum(b["rows"] for b in progress),
        "windows_written": upsert.rows,
        "batches": progress,
    }
    spark.stop()
    print(_RESULT_MARK + json.dumps(result), flush=True)
    return 0


def parse_result(log: str) -> dict[str, Any] | None:
    """The result line :func:`main` printed, from the process's output (None if missing)."""
    for line in reversed(log.splitlines()):
        if line.startswith(_RESULT_MARK):
            parsed: dict[str, Any] = json.loads(line[len(_RESULT_MARK) :])
            return parsed
    return None


if __name__ == "__main__":
    # Through the module, not ``__main__``: Spark pickles decode_payments by reference then,
    # and its workers import it (main() puts the repository on their PYTHONPATH).
    from bench import window_query

    sys.exit(window_query.main())
