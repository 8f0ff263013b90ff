"""LogOffsets on the real broker: exact ends and starts, offsets at a time, unknown topics."""

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from refold.contracts.kafka.offsets import LogOffsets, OffsetsError


def produce(bootstrap, topic, counts, linger_ms=50):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "acks": "all",
            "batch.num.messages": 100_000,
        }
    )
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, b"v%d" % i, b"k", partition=partition)
    assert producer.flush(30) == 0


def test_end_offsets_are_exact_even_when_the_newest_batch_is_large(kafka_bootstrap, make_topic):
    topic = make_topic(partitions=4)
    counts = {0: 5000, 1: 1, 2: 0, 3: 777}
    produce(kafka_bootstrap, topic, counts)  # linger: partition 0 lands in few big batches
    offsets = LogOffsets({"bootstrap.servers": kafka_bootstrap})
    try:
        tps = [(topic, p) for p in offsets.partitions(topic)]
        assert offsets.end_offsets(tps) == {(topic, p): c for p, c in counts.items()}
        assert offsets.start_offsets(tps) == {(topic, p): 0 for p in counts}
        # Repeated calls resume at the known end and still see new records.
        produce(kafka_bootstrap, topic, {2: 3, 0: 10})
        assert offsets.end_offsets(tps) == {
            (topic, 0): 5010,
            (topic, 1): 1,
            (topic, 2): 3,
            (topic, 3): 777,
        }
    finally:
        offsets.close()


def test_the_end_counts_every_acknowledged_record_at_once(kafka_bootstrap, make_topic):
    topic = make_topic(partitions=2)
    offsets = LogOffsets({"bootstrap.servers": kafka_bootstrap})
    try:
        tps = [(topic, 0), (topic, 1)]
        for total in (100, 2100, 2101):  # one big batch in between
            produce(kafka_bootstrap, topic, {0: total - offsets.end_offsets(tps)[(topic, 0)]})
            assert offsets.end_offsets(tps) == {(topic, 0): total, (topic, 1): 0}
        # A consumer's view of the end agrees (the high watermark).
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "x"})
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.close()
        assert high == 2101
    finally:
        offsets.close()


def test_unknown_topic_is_a_clear_error_and_is_not_created(kafka_bootstrap):
    offsets = LogOffsets({"bootstrap.servers": kafka_bootstrap}, timeout=5)
    with pytest.raises(OffsetsError, match="no-such-topic"):
        offsets.partitions("no-such-topic")
    offsets.close()


def test_offset_at_time_follows_record_timestamps(kafka_bootstrap, make_topic):
    topic = make_topic(partitions=2)
    base = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i in range(50):  # partition 0: one record per second; partition 1: one per 10 s
        producer.produce(topic, b"x", timestamp=base + i * 1000, partition=0)
        producer.produce(topic, b"y", timestamp=base + i * 10_000, partition=1)
    assert producer.flush(30) == 0
    offsets = LogOffsets({"bootstrap.servers": kafka_bootstrap})
    try:
        assert offsets.offset_at_time(topic, 0, base) == 0
        assert offsets.offset_at_time(topic, 0, base + 5_500) == 6
        assert offsets.offset_at_time(topic, 0, base + 49_000) == 49
        assert offsets.offset_at_time(topic, 0, base + 10**9) == 50  # after the last: the end
        assert offsets.offset_at_time(topic, 1, base + 25_000) == 3
        assert offsets.offset_at_time(topic, 1, base - 1) == 0
        assert offsets.record_timestamp(topic, 1, 3) == (base + 30_000, 3)
        assert offsets.record_timestamp(topic, 1, 50) is None
    finally:
        offsets.close()
