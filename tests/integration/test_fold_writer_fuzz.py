"""FoldWriter on random and mutated batches, against real Redis and a real broker.

Every record of a batch is applied or dead-lettered with a reason, the positions move past the
batch, and the state in Redis is what the oracle folds from the records that decode and carry
their entity's key. Derandomized (same examples every run), without an example database.
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from dataclasses import replace
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings, strategies as st

from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError
from refold.contracts.layout import position_field
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from tests.support.waiting import assert_eventually

P = OrderStateProjection()
CODEC = EventCodec()
TOPIC = "orders"
# A fresh key prefix per example: the fixtures are shared by all examples of one test.
_EXAMPLE = itertools.count()


def partition_of(key: bytes | None, partitions: int) -> int:
    """Where a keyed record lands; not hash(), which PYTHONHASHSEED changes between runs."""
    return zlib.crc32(key or b"") % partitions


@st.composite
def junk_records(draw: st.DrawFn, valid: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
    """A (key, value) that is not a well-formed, correctly keyed event, or is one by chance."""
    key, value = draw(st.sampled_from(valid))
    kind = draw(
        st.sampled_from(
            ["random", "truncated", "flipped", "extended", "none-value", "none-key", "wrong-key"]
        )
    )
    if kind == "random":
        return key, draw(st.binary(max_size=80))
    if kind == "truncated":
        return key, value[: draw(st.integers(0, len(value) - 1))]
    if kind == "flipped":
        mutated = bytearray(value)
        for flip in draw(st.lists(st.integers(0, 8 * len(value) - 1), min_size=1, max_size=4)):
            mutated[flip // 8] ^= 1 << (flip % 8)
        return key, bytes(mutated)
    if kind == "extended":
        return key, value + draw(st.binary(min_size=1, max_size=16))
    if kind == "none-value":
        return key, None
    if kind == "none-key":
        return None, value
    other = draw(st.sampled_from([b"", b"nobody", *(k for k, _v in valid if k != key)]))
    return other, value


@st.composite
def batches(draw: st.DrawFn) -> list[SourceRecord]:
    """Simulator events (anomalies included) with junk mixed in, offsets per partition."""
    seed = draw(st.integers(0, 10_000))
    partitions = draw(st.integers(1, 3))
    events = OrderSimulator(draw(st.integers(1, 6)), seed=seed, anomaly_rate=0.2, concurrency=3)
    valid = [(e["order_id"].encode(), CODEC.encode(t, e)) for t, e in events]
    pairs: list[tuple[Any, Any]] = list(valid)
    for junk in draw(st.lists(junk_records(valid), max_size=12)):
        pairs.insert(draw(st.integers(0, len(pairs))), junk)
    offsets = [0] * partitions
    records = []
    for key, value in pairs:
        partition = partition_of(key, partitions)
        records.append(SourceRecord(TOPIC, partition, offsets[partition], key, value))
        offsets[partition] += 1
    return records


def oracle(records: list[SourceRecord]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """The events FoldWriter may fold (they decode and carry their entity's key), in order,
    and how many records did not decode."""
    events = []
    undecodable = 0
    for record in records:
        try:
            decoded = CODEC.decode(record.value)
        except DeserializationError:
            undecodable += 1
            continue
        event_type, data = decoded.event_type, decoded.data
        if record.key == str(P.key(event_type, data)).encode():
            events.append((event_type, data))
    return events, undecodable


def redis_state(client: redis.Redis, target: FoldTarget) -> tuple[dict[str, Any], dict[str, int]]:
    keys = target.keys
    prefix = keys.table(P.table, "").encode()
    names = sorted(client.scan_iter(match=keys.table_pattern(P.table)))
    values = client.mget(names) if names else []
    states = {
        name.removeprefix(prefix).decode(): orjson.loads(raw)
        for name, raw in zip(names, values, strict=True)
    }
    counters = {
        name.decode(): int(value)
        for name, value in client.hgetall(keys.aggregate(P.aggregate)).items()
        if int(value)
    }
    return states, counters


@pytest.fixture
def base_target(redis_url, kafka_bootstrap, make_topic, unique):
    return FoldTarget(
        "order_state",
        1,
        redis_url,
        f"fuzz-{unique}",
        (("bootstrap.servers", kafka_bootstrap),),
        make_topic(partitions=1, prefix="dlq"),
    )


@pytest.fixture
def client(base_target):
    """One Redis client for all examples (each example's prefix has its own output streams)."""
    shared = FoldWriter(base_target, P)
    yield shared.redis
    shared.redis.close()


@settings(
    max_examples=25,
    derandomize=True,
    database=None,
    deadline=None,  # a batch with dead letters waits for the broker's acknowledgements
    # The fixtures are shared by the examples on purpose; each example has its own prefix.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches())
def test_every_record_is_applied_or_dead_lettered_and_state_equals_the_oracle(
    base_target, client, records
):
    target = replace(base_target, key_prefix=f"{base_target.key_prefix}-{next(_EXAMPLE)}")
    writer = FoldWriter(target, P)
    writer._redis = client

    outcome = writer.apply(records)

    folded, undecodable = oracle(records)
    expected = fold_all(P, folded)
    assert outcome.skipped == 0
    assert outcome.applied + outcome.rejected + outcome.undecodable == len(records)
    assert outcome.applied == len(folded) - len(expected.rejected)
    assert outcome.undecodable == undecodable
    last: dict[str, int] = {}
    for record in records:
        last[position_field(record.topic, record.partition)] = record.offset + 1
    assert outcome.positions == last
    positions = client.hgetall(target.keys.positions)
    assert {f.decode(): int(v) for f, v in positions.items()} == last
    assert redis_state(client, target) == (expected.states, dict(expected.aggregate))


def test_each_bad_record_is_one_dead_letter_with_its_reason(base_target, kafka_bootstrap):
    events = list(OrderSimulator(3, seed=8, anomaly_rate=0, concurrency=3))
    valid = [(e["order_id"].encode(), CODEC.encode(t, e)) for t, e in events]
    key, value = valid[0]
    shipped_early = CODEC.encode(
        "OrderShipped",
        {
            "event_id": "x",
            "order_id": "nobody",
            "carrier": "DHL",
            "tracking_number": "T",
            "shipped_at": 1,
        },
    )
    bad = [
        (key, b"not avro", "bad-magic"),
        (key, None, "bad-magic"),
        (key, value[:2] + b"\x11" * 8 + value[10:], "unknown-fingerprint"),
        (key, value[:-3], "bad-body"),
        (None, value, "key-mismatch"),
        (b"someone-else", value, "key-mismatch"),
        (b"nobody", shipped_early, "rejected"),
    ]
    pairs = [*valid, *((k, v) for k, v, _reason in bad)]
    records = [SourceRecord(TOPIC, 0, offset, k, v) for offset, (k, v) in enumerate(pairs)]

    outcome = FoldWriter(base_target, P).apply(records)

    assert (outcome.applied, outcome.undecodable, outcome.rejected) == (len(valid), 4, 3)
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(base_target.dlq_topic, 0, 0)])
    letters: list[Any] = []

    def all_arrived() -> bool:
        letters.extend(m for m in consumer.consume(100, timeout=0.5) if m.error() is None)
        return len(letters) >= len(bad)

    try:
        assert_eventually(all_arrived, timeout=15, message=lambda: f"got {len(letters)}")
        letters.extend(m for m in consumer.consume(100, timeout=1.0) if m.error() is None)
    finally:
        consumer.close()
    assert len(letters) == len(bad)  # one each, nothing for the records that were applied
    headers = [dict(m.headers()) for m in letters]
    assert Counter(h["refold.reason"].decode() for h in headers) == Counter(r for *_, r in bad)
    by_offset = {int(h["refold.origin.offset"]): m for h, m in zip(headers, letters, strict=True)}
    for offset, (k, v, _reason) in enumerate(bad, start=len(valid)):
        assert (by_offset[offset].key(), by_offset[offset].value()) == (k, v)
