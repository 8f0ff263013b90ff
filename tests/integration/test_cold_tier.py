"""The archive as the log's cold tier, on a real broker and Redis, no Spark (DESIGN.md 20).

The archive task archives a topic in three batches: orders, records that do not decode (they
go to the dead-letter topic) and records with headers. Then retention deletes the head of
every partition (``delete_records``). A read of the whole log with the archive as cold tier
hands over exactly what a read of the untruncated log handed over: the same offsets, keys,
values, headers, timestamps and timestamp types, in the same order. Where the archive lacks a
range (its ledger), the read and the source's start are refused with the missing offsets.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import position_field
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import ArchiveProcessor
from refold.processors.runtime.archive.cold_tier import ArchiveGapError
from refold.processors.runtime.archive.sink import ArchivePlan, archive_ranges
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.kafka_ranges import (
    SourceOptions,
    read_messages,
    resolve_starting_offsets,
)
from refold.services.producer.publisher import EventPublisher

PARTITIONS = 3


def _seen(messages) -> list[tuple]:
    """What a reader gets, per partition in offset order (partitions interleave freely)."""
    out = []
    for m in messages:
        headers = tuple((k, bytes(v) if v is not None else None) for k, v in m.headers() or ())
        out.append(
            (m.topic(), m.partition(), m.offset(), m.key(), m.value(), headers, m.timestamp())
        )
    return sorted(out, key=lambda r: (r[1], r[2]))


@pytest.fixture
def archived(kafka_bootstrap, redis_url, make_topic, unique, tmp_path):
    """A topic archived in three batches; its log as read before any deletion."""
    topic = make_topic(partitions=PARTITIONS, prefix="orders")
    dlq = make_topic(partitions=1, prefix="dlq")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    publisher = EventPublisher(
        kafka, topics=[dataclasses.replace(ORDERS, name=topic, partitions=PARTITIONS)]
    )
    publisher.emit_many(list(OrderSimulator(150, seed=11)))
    publisher.close()
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(PARTITIONS * 4):  # undecodable, and decodable-looking with headers
        raw.produce(
            topic,
            value=b"not avro %d" % n,
            key=b"k%d" % n,
            partition=n % PARTITIONS,
            headers=[("trace", b"t%d" % n), ("empty", None)],
        )
    raw.flush(30)
    publisher = EventPublisher(
        kafka, topics=[dataclasses.replace(ORDERS, name=topic, partitions=PARTITIONS)]
    )
    publisher.emit_many(list(OrderSimulator(100, seed=12, order_prefix="late-")))
    publisher.close()

    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        ends = offsets.end_offsets([(topic, p) for p in range(PARTITIONS)])
    finally:
        offsets.close()
    target = FoldTarget(
        "archive", 1, redis_url, f"cold-{unique}", (("bootstrap.servers", kafka_bootstrap),), dlq
    )
    plan = ArchivePlan(
        target,
        ArchiveProcessor("archive", tmp_path / "archive", ORDERS.event_types, DATES),
        EventCodec(),
    )
    registry = GenerationRegistry.of(redis_client(redis_url), "archive", target.key_prefix)
    registry.create({}, live=True)
    registry.set_positions(1, {position_field(topic, p): 0 for p in range(PARTITIONS)})
    plan.store.claim("archive", target.key_prefix, 1)
    start = dict.fromkeys(ends, 0)
    for batch_id, fraction in enumerate((0.3, 0.7, 1.0)):
        stop = {tp: int(e * fraction) for tp, e in ends.items()}
        archive_ranges(
            plan, tuple((t, p, start[t, p], stop[t, p]) for t, p in sorted(ends)), batch_id
        )
        start = stop
    options = SourceOptions(kafka=target.kafka, topics=(topic,))
    whole = tuple((topic, p, 0, ends[topic, p]) for p in range(PARTITIONS))
    before = _seen(m for chunk in read_messages(options, whole) for m in chunk)
    assert len(before) == sum(ends.values())
    return topic, ends, plan, options, whole, before


def _delete_head(bootstrap: str, topic: str, ends: dict, share: float) -> dict:
    cut = {tp: int(end * share) for tp, end in ends.items()}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(t, p, o) for (t, p), o in cut.items()])
    for future in futures.values():
        future.result(timeout=30)
    return cut


def test_a_read_below_the_log_start_hands_over_the_archives_records_as_kafka_did(
    archived, kafka_bootstrap
):
    topic, ends, plan, options, whole, before = archived
    _delete_head(kafka_bootstrap, topic, ends, 0.6)
    with pytest.raises(RuntimeError, match="no longer in the log"):
        list(read_messages(options, whole))  # no cold tier: refused, as before

    cold = dataclasses.replace(options, archive_root=str(plan.archive.root))
    after = _seen(m for chunk in read_messages(cold, whole) for m in chunk)

    assert after == before
    # A range that lies wholly below the log start, and one that straddles it.
    tp0 = ends[topic, 0]
    part = ((topic, 0, 1, tp0 // 3), (topic, 1, ends[topic, 1] // 2, ends[topic, 1]))
    expected = [
        r
        for r in before
        if (r[1] == 0 and 1 <= r[2] < tp0 // 3) or (r[1] == 1 and r[2] >= ends[topic, 1] // 2)
    ]
    assert (
        sorted(_seen(m for c in read_messages(cold, part) for m in c), key=lambda r: (r[1], r[2]))
        == expected
    )


def test_a_start_or_a_read_the_archive_does_not_cover_is_refused_with_the_offsets(
    archived, kafka_bootstrap
):
    topic, ends, plan, options, whole, _before = archived
    cut = _delete_head(kafka_bootstrap, topic, ends, 0.6)
    root = str(plan.archive.root)
    offsets = LogOffsets(dict(options.kafka))
    try:
        resolved = resolve_starting_offsets(offsets, [topic], "earliest")
        assert resolved == cut  # earliest is the log's
        wanted = json.dumps({topic: {"0": 0, "1": 0, "2": 0}})
        assert resolve_starting_offsets(
            offsets, [topic], wanted, archive_root=root
        ) == dict.fromkeys(cut, 0)
        # The archive lost a range of partition 1 (its ledger no longer covers it).
        plan.store.ledger.update(topic, 1, lambda c: c.cut(5).add(9, ends[topic, 1]))
        with pytest.raises(ValueError, match=rf"{topic}/1 .* lacks offsets 5\.\.8"):
            resolve_starting_offsets(offsets, [topic], wanted, archive_root=root)
    finally:
        offsets.close()
    cold = dataclasses.replace(options, archive_root=root)
    with pytest.raises(
        ArchiveGapError, match=rf"{topic}/1: offsets 5\.\.8 are below the log start"
    ):
        list(read_messages(cold, whole))
