"""A processor's outputs in Kafka transactions: a read_committed reader sees each one once.

order_state sends its status changes (an output stream) and its dead letters. A writer "dies" at
each point between its two commits, and a new writer (its successor after a kill -9) applies the
same records:

1. after the Kafka commit, before the Redis one: the successor skips what was committed;
2. after producing, before the Kafka commit: the broker aborts the open transaction after its
   timeout (read_uncommitted sees its records, read_committed never does);
3. two writers take turns, as Spark's Python workers do: each reads the markers;
4. a call to the group coordinator never returns (librdkafka's bug after a broker restart):
   the writer leaves that client and sends the batch again with a new one;
5. killed with its transaction open: the next holder of the generation fences its writers, and
   nobody waits for the broker to abort it.

Every time: each output once on the topics, and the state == a plain fold of the orders.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import EventRejectedError, fold_one
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime import output_transactions
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages
from refold.processors.runtime.output_transactions import (
    OutputTransactions,
    fence_writers,
    marker_group,
)
from refold.services.reader.state_reader import StateReader
from tests.support.chain import senders
from tests.support.waiting import assert_eventually

CODEC = EventCodec()


class _KilledError(Exception):
    """Where the test's writer stops, as a kill -9 would stop it."""


def _records(count: int) -> tuple[list[tuple[str, dict[str, Any]]], list[SourceRecord]]:
    """Order events on one partition of ``orders``, and three records that do not decode."""
    events = list(OrderSimulator(count, seed=5))
    records = [
        SourceRecord("orders", 0, i, e["order_id"].encode(), CODEC.encode(t, e))
        for i, (t, e) in enumerate(events)
    ]
    bad = [SourceRecord("orders", 0, len(records) + i, b"x", b"not avro") for i in range(3)]
    return events, records + bad


def _setup(target: FoldTarget, make_topic) -> tuple[FoldTarget, OrderStateProjection, str]:
    changes = make_topic(partitions=2, prefix="changes")
    projection = OrderStateProjection(changes_topic=changes)
    return dataclasses.replace(target, topics=("orders",)), projection, changes


def _assert_once(target: FoldTarget, changes: str, events, redis_url: str, sent: int) -> None:
    kafka = dict(target.kafka)["bootstrap.servers"]
    ids = senders(kafka, changes, "read_committed")
    assert len(ids) == len(set(ids)) == sent
    letters = senders(kafka, target.dlq_topic, "read_committed")
    assert len(letters) == 3
    reader = StateReader(redis_client(redis_url), "order_state", target.key_prefix)
    states = dict(reader.scan("orders", target.generation))
    assert states == fold_all(OrderStateProjection(), events).states


def _changes(events) -> int:
    """How many status changes order_state sends for ``events`` (a plain fold)."""
    projection = OrderStateProjection(changes_topic="changes")
    states: dict[str, Any] = {}
    sent = 0
    for event_type, data in events:
        key = data["order_id"]
        try:
            new, _encoded, _contribution, effects = fold_one(
                projection, states.get(key), event_type, data
            )
        except EventRejectedError:
            continue
        states[key] = new
        sent += sum(e.topic == "changes" for e in effects)
    return sent


def test_a_crash_between_the_kafka_and_the_redis_commit_sends_nothing_twice(
    target, make_topic, redis_url, monkeypatch
):
    target, projection, changes = _setup(target, make_topic)
    events, records = _records(200)
    first = FoldWriter(target, projection)
    first.apply(records[:60])  # a batch that commits in full

    def killed(self, outbox, new_pos):
        committed(self, outbox, new_pos)
        raise _KilledError

    committed = FoldWriter._commit_outputs
    monkeypatch.setattr(FoldWriter, "_commit_outputs", killed)
    with pytest.raises(_KilledError):
        first.apply(records[60:])  # outputs committed in Kafka, state not in Redis
    monkeypatch.setattr(FoldWriter, "_commit_outputs", committed)

    successor = FoldWriter(target, projection)
    outcome = successor.apply(records[60:])
    assert outcome.applied == len(events) - 60
    _assert_once(target, changes, events, redis_url, sent=_changes(events))


def test_a_crash_before_the_kafka_commit_leaves_nothing_a_reader_sees(
    target, make_topic, redis_url
):
    target, projection, changes = _setup(target, make_topic)
    events, records = _records(150)
    kafka = dict(target.kafka)["bootstrap.servers"]
    # What a writer leaves when it dies after producing, before committing: an open
    # transaction with records on the topic. The broker aborts it after its timeout.
    dying = Producer(
        {
            "bootstrap.servers": kafka,
            "transactional.id": f"dying-{changes}",
            "transaction.timeout.ms": 2_000,
        }
    )
    dying.init_transactions(30)
    dying.begin_transaction()
    dying.produce(changes, b"half a batch", b"k", headers=[("refold.origin.id", b"dead")])
    dying.flush(30)
    assert senders(kafka, changes, "read_uncommitted") == [b"dead"]  # the premise

    FoldWriter(target, projection).apply(records)
    # read_committed waits for the open transaction until the broker aborts it, then reads on.
    assert_eventually(
        lambda: len(senders(kafka, changes, "read_committed")) == _changes(events), timeout=60
    )
    _assert_once(target, changes, events, redis_url, sent=_changes(events))
    assert b"dead" in senders(kafka, changes, "read_uncommitted")


def test_a_writer_killed_in_its_transaction_is_fenced_by_the_next_holder(
    target, make_topic, redis_url
):
    # What a kill -9 between the markers and the Kafka commit leaves: an open transaction that
    # holds the marker group's offsets. A successor reading the markers would wait until the
    # broker aborts it (transaction.timeout.ms, 60 s, checked every 10 s). The processor that
    # takes the generation's lease fences its writers first (runner._fence_writers).
    target, projection, changes = _setup(target, make_topic)
    events, records = _records(150)
    client = redis_client(redis_url)
    writers = target.keys.writers
    first = FoldWriter(target, projection)
    first.apply(records[:60])
    first_id = first.outputs.transactional_id
    assert client.smembers(writers) == {first_id.encode()}
    producer = first.outputs._transactional()
    producer.begin_transaction()
    producer.produce(changes, b"half a batch", b"k", headers=[("refold.origin.id", b"dead")])
    metadata = first.outputs._group_consumer().consumer_group_metadata()
    producer.send_offsets_to_transaction([TopicPartition("orders", 0, 100)], metadata, 30)

    started = time.monotonic()
    assert fence_writers(dict(target.kafka), client, writers) == 1
    assert client.smembers(writers) == set()
    successor = FoldWriter(target, projection)
    successor.apply(records[60:100])
    # The broker aborts no earlier than 60 s after the transaction began (before `started`).
    assert time.monotonic() - started < 45
    # A query started again in the same process fences its own writers, alive between two
    # batches in the workers it reuses: they go on with a new producer, and add their id again.
    assert fence_writers(dict(target.kafka), client, writers) == 1
    successor.apply(records[100:])
    assert client.smembers(writers) == {successor.outputs.transactional_id.encode()}
    _assert_once(target, changes, events, redis_url, sent=_changes(events))
    assert b"dead" in senders(dict(target.kafka)["bootstrap.servers"], changes, "read_uncommitted")


def test_writers_that_take_turns_send_each_output_once(target, make_topic, redis_url):
    # Spark runs a partition's batches in whichever Python worker is free: two writers of one
    # generation, each with its own transactional id, take turns; each reads the markers.
    target, projection, changes = _setup(target, make_topic)
    events, records = _records(150)
    first, second = FoldWriter(target, projection), FoldWriter(target, projection)
    first.apply(records[:50])
    second.apply(records[:100])
    first.apply(records[50:])
    second.apply(records)
    _assert_once(target, changes, events, redis_url, sent=_changes(events))


def _sends_the_markers(call) -> bool:
    return getattr(call, "__qualname__", "").startswith("OutputTransactions._commit")


def _reads_the_markers(call) -> bool:
    return getattr(getattr(call, "func", None), "__name__", "") == "committed"


@pytest.mark.parametrize("hangs", [_sends_the_markers, _reads_the_markers])
def test_a_kafka_call_that_never_returns_is_left_and_the_batch_sent_once(
    target, make_topic, redis_url, monkeypatch, hangs
):
    # librdkafka 2.x can block a call to the group coordinator for good after the broker it
    # cached as coordinator restarted (a broker kill -9 in test_faults met it, in
    # send_offsets_to_transaction and in the marker consumer's committed()). Here the first
    # such call "hangs", after the batch's records were produced into the transaction.
    target, projection, changes = _setup(target, make_topic)
    events, records = _records(150)
    monkeypatch.setattr(output_transactions, "_GRACE_S", 0.2)
    bounded = output_transactions._bounded
    hung: list[object] = []
    gate = threading.Event()

    def hangs_once(call, timeout):
        if not hung and hangs(call):
            hung.append(call)
            return bounded(lambda _t: gate.wait(), 0.1)
        return bounded(call, timeout)

    monkeypatch.setattr(output_transactions, "_bounded", hangs_once)
    writer = FoldWriter(target, projection)
    outcome = writer.apply(records)
    assert hung  # the premise: the call was made, and left
    assert outcome.applied == len(events)
    # A left producer's open transaction was aborted by its successor (same transactional.id),
    # so a read_committed reader sees each output once, at once.
    _assert_once(target, changes, events, redis_url, sent=_changes(events))
    gate.set()  # ends the left thread


def test_the_markers_say_how_far_each_source_partition_is_committed(target, make_topic):
    assert marker_group("x", "p", 3, None) == "refold.outputs.x.p.g3"
    assert marker_group("x", "p", 3, 2, "1795") == "refold.outputs.x.p.g3.t1795.s2"
    target, projection, _changes_topic = _setup(target, make_topic)
    _events, records = _records(100)
    writer = FoldWriter(target, projection)
    assert writer.outputs.marks([("orders", 0), ("orders", 1)]) == {
        ("orders", 0): 0,
        ("orders", 1): 0,
    }
    writer.apply(records[:300])
    # Read by another writer (a fresh client of the group): the end of the batch, committed
    # with its outputs; a partition without outputs has no marker.
    other = OutputTransactions(dict(target.kafka), writer.outputs.group)
    assert other.marks([("orders", 0), ("orders", 1)]) == {("orders", 0): 300, ("orders", 1): 0}
    other.close()


def test_a_range_that_starts_at_a_transaction_marker_or_an_aborted_record_is_read(
    kafka_bootstrap, make_topic
):
    topic = make_topic(partitions=1, prefix="txn")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for value, commit in ((b"a", True), (b"aborted", False), (b"b", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    # offsets: a=0, marker=1, aborted=2, marker=3, b=4, marker=5
    options = SourceOptions(kafka=(("bootstrap.servers", kafka_bootstrap),), topics=(topic,))
    for start in (1, 2, 3):
        read = [
            m.value() for chunk in read_messages(options, ((topic, 0, start, 6),)) for m in chunk
        ]
        assert read == [b"b"]


def test_a_range_below_the_log_start_is_a_data_loss(kafka_bootstrap, make_topic):
    topic = make_topic(partitions=1, prefix="gone")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (b"a", b"b", b"c"):
        producer.produce(topic, value)
    producer.flush(30)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 2)]).values():
        future.result()
    options = SourceOptions(kafka=(("bootstrap.servers", kafka_bootstrap),), topics=(topic,))
    with pytest.raises(RuntimeError, match=r"offsets 0\.\.1 are no longer in the log"):
        list(read_messages(options, ((topic, 0, 0, 3),)))
    lenient = dataclasses.replace(options, fail_on_data_loss=False)
    read = [m.value() for chunk in read_messages(lenient, ((topic, 0, 0, 3),)) for m in chunk]
    assert read == [b"c"]
    assert Counter(read) == Counter({b"c": 1})
