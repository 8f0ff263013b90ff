"""Write and read whole topics in tests: events published, records read up to each end.

``publish`` and ``source_records`` are the fixtures' way to put events on a topic and take
them back as the fold envelope gets them (``SourceRecord`` with real offsets, so a writer can
refill a range it lost from the log).

The one way tests read a topic's records: up to each partition's end (for ``read_committed``
the last stable offset: records of open transactions are not readable yet), told by librdkafka's
end-of-partition events. It returns as soon as every partition has reached its end, instead of
waiting for seconds of silence, so a probe polled by ``assert_eventually`` costs milliseconds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from refold.contracts.kafka.consumers import Isolation, passive_consumer
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages
from refold.services.producer.publisher import EventPublisher

__all__ = ["publish", "read_to_end", "source_records"]


def publish(
    bootstrap: str, spec: TopicSpec, topic: str, events: Iterable[tuple[str, dict[str, Any]]]
) -> None:
    """Publish ``events`` with the SDK to ``topic``, routed as ``spec`` routes them."""
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=bootstrap), topics=[dataclasses.replace(spec, name=topic)]
    )
    publisher.emit_many(list(events))
    publisher.close()


def source_records(
    bootstrap: str, topic: str, partitions: int, since: Mapping[int, int] | None = None
) -> tuple[list[SourceRecord], dict[tuple[str, int], int]]:
    """The records of ``topic`` from ``since`` (per partition) to its end, by partition, offset.

    Returns:
        The records and the end offsets they were read to.
    """
    with LogOffsets({"bootstrap.servers": bootstrap}) as offsets:
        ends = offsets.end_offsets([(topic, p) for p in range(partitions)])
    since = since or {}
    ranges = tuple(
        (topic, p, since.get(p, 0), ends[(topic, p)])
        for p in range(partitions)
        if ends[(topic, p)] > since.get(p, 0)
    )
    options = SourceOptions(kafka=(("bootstrap.servers", bootstrap),), topics=(topic,))
    records = [
        SourceRecord.of_message(m)
        for chunk in read_messages(options, ranges, slot="test")
        for m in chunk
    ]
    return sorted(records, key=lambda r: (r.partition, r.offset)), ends


def read_to_end(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout: float = 30.0,
) -> list[Message]:
    """Every readable record of ``topic`` now, partition by partition in offset order.

    Raises:
        AssertionError: A partition did not reach its end within ``timeout`` seconds.
    """
    consumer = passive_consumer(
        {"bootstrap.servers": bootstrap}, "test-reader", isolation=isolation, eof=True
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[Message] = []
        ended: set[int] = set()
        while len(ended) < len(partitions):
            message = consumer.poll(timeout)
            assert message is not None, f"{topic} was not read to its end in {timeout:.0f} s"
            error = message.error()
            if error is None:
                found.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition())
        return sorted(found, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def interleaved(records: Iterable[SourceRecord], rng: random.Random) -> list[SourceRecord]:
    """Every record once, each topic partition's in log order, the partitions interleaved at
    random: an order in which parallel writers may fold them."""
    queues: dict[tuple[str, int], list[SourceRecord]] = {}
    for record in records:
        queues.setdefault((record.topic, record.partition), []).append(record)
    lists = list(queues.values())
    out = []
    while lists:
        queue = rng.choice(lists)
        out.append(queue.pop(0))
        if not queue:
            lists.remove(queue)
    return out


def random_chunks(
    records: list[SourceRecord], rng: random.Random, max_size: int
) -> list[list[SourceRecord]]:
    """``records`` in order, cut into chunks of 1 to ``max_size``: batches of any size."""
    chunks, i = [], 0
    while i < len(records):
        size = rng.randint(1, max_size)
        chunks.append(records[i : i + size])
        i += size
    return chunks
