"""The refold_kafka source in real streaming queries: exactly [start, end), batch after batch."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer


def produce(bootstrap, topic, counts, linger_ms=20, first=None):
    """Write `count` records per partition; value = "<partition>:<offset>", key = "k<offset>"."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "acks": "all",
            "batch.num.messages": 100_000,
        }
    )
    for partition, count in counts.items():
        base = (first or {}).get(partition, 0)
        for i in range(base, base + count):
            producer.produce(
                topic, f"{partition}:{i}".encode(), f"k{i}".encode(), partition=partition
            )
    assert producer.flush(30) == 0


def run_stream(spark, bootstrap, topic, checkpoint, *, expect, options=None, timeout=120):
    """Run a query until `expect` records arrived; return (batches, rows)."""
    rows: list[tuple] = []
    batches: list[tuple[int, int]] = []

    def collect(df, batch_id):
        got = df.select("topic", "partition", "offset", "key", "value", "timestamp").collect()
        batches.append((batch_id, len(got)))
        rows.extend(tuple(r) for r in got)

    reader = (
        spark.readStream.format("refold_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    deadline = time.monotonic() + timeout
    try:
        while len(rows) < expect and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.1)
        time.sleep(1.0)  # nothing more may arrive
    finally:
        query.stop()
    return batches, rows


def assert_exactly(rows, topic, ranges):
    """Every offset of every range exactly once, with its key and value."""
    seen = [(r[1], r[2]) for r in rows]
    assert len(seen) == len(set(seen)), "duplicates"
    expected = {(p, o) for p, (s, e) in ranges.items() for o in range(s, e)}
    assert set(seen) == expected
    for row in rows:
        assert row[0] == topic
        assert row[4] == f"{row[1]}:{row[2]}".encode()
        assert row[3] == f"k{row[2]}".encode()
        assert row[5] is not None


def test_reads_every_offset_once_across_partitions_and_micro_batches(
    spark, kafka_bootstrap, make_topic, tmp_path
):
    topic = make_topic(partitions=4)
    counts = {0: 6000, 1: 2500, 2: 1, 3: 0}
    produce(kafka_bootstrap, topic, counts)  # partition 0's newest batch holds many records
    batches, rows = run_stream(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "cp",
        expect=sum(counts.values()),
        options={"maxOffsetsPerTrigger": "2000", "maxTasks": "2"},
    )
    assert_exactly(rows, topic, {p: (0, c) for p, c in counts.items()})
    non_empty = [n for _b, n in batches if n]
    assert len(non_empty) >= 4  # the limit split the backlog into several micro-batches
    assert max(non_empty) <= 2000


def test_restart_from_the_checkpoint_continues_without_gaps_or_duplicates(
    spark, kafka_bootstrap, make_topic, tmp_path
):
    topic = make_topic(partitions=3)
    produce(kafka_bootstrap, topic, {0: 1000, 1: 1000, 2: 1000})
    _b, first = run_stream(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "cp",
        expect=3000,
        options={"maxOffsetsPerTrigger": "700", "maxTasks": "1"},
    )
    produce(kafka_bootstrap, topic, {0: 500, 2: 10}, first={0: 1000, 2: 1000})
    _b, second = run_stream(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "cp",
        expect=510,
        options={"maxOffsetsPerTrigger": "700", "maxTasks": "1"},
    )
    assert_exactly(first + second, topic, {0: (0, 1500), 1: (0, 1000), 2: (0, 1010)})
    assert {(r[1], r[2]) for r in second} == {(0, o) for o in range(1000, 1500)} | {
        (2, o) for o in range(1000, 1010)
    }


def test_starting_offsets_json_is_honoured(spark, kafka_bootstrap, make_topic, tmp_path):
    topic = make_topic(partitions=3)
    produce(kafka_bootstrap, topic, {0: 100, 1: 100, 2: 100})
    start = json.dumps({topic: {"0": 90, "1": -1}})  # 2 is missing: earliest
    _b, rows = run_stream(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path / "cp",
        expect=110,
        options={"startingOffsets": start},
    )
    assert_exactly(rows, topic, {0: (90, 100), 1: (100, 100), 2: (0, 100)})


def test_a_start_below_the_log_start_fails_unless_data_loss_is_allowed(kafka_bootstrap, make_topic):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from refold.processors.runtime.kafka_source import KafkaStreamReader, SourceOptions

    topic = make_topic(partitions=1)
    produce(kafka_bootstrap, topic, {0: 100})
    # The log loses offsets 0..39, as retention would remove them.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        assert future.result(timeout=30).low_watermark == 40

    def reader(fail_on_data_loss):
        options = SourceOptions.parse(
            {
                "kafka.bootstrap.servers": kafka_bootstrap,
                "subscribe": topic,
                "startingOffsets": json.dumps({topic: {"0": 10}}),
                "failOnDataLoss": str(fail_on_data_loss).lower(),
            }
        )
        return KafkaStreamReader(options)

    with pytest.raises(ValueError, match="log starts at 40"):
        reader(True).initialOffset()
    assert reader(False).initialOffset() == {topic: {"0": 40}}
