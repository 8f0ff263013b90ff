"""A DataFrame processor's sink and decode task against real Redis and a real broker, no Spark.

The sink applies a batch once, by its batch id (a re-executed or older batch changes nothing),
with the positions read from the checkpoint's offsets log; the decode task types the events it
counts, passes other types by and dead-letters what does not decode, once across a rebuild.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pyarrow as pa
import redis
from confluent_kafka import Consumer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.fold.dataframe import event_columns
from refold.processors.runtime import dataframe
from refold.processors.runtime.dataframe import DataFrameSink, DecodePlan, _decode_task
from refold.processors.runtime.envelope import FoldTarget
from refold.services.reader.state_reader import StateReader
from tests.support.dead_letters import dlq_letters

_OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n'


class _Frame:
    """The part of a Spark DataFrame the sink uses."""

    def __init__(self, rows: list[tuple[str | None, str]]) -> None:
        self.rows = rows

    def collect(self) -> list[tuple[str | None, str]]:
        return self.rows


def _checkpoint(root: Path, ends: dict[int, dict[str, dict[str, int]]]) -> Path:
    """A checkpoint whose offsets log has an entry per batch id, as Spark writes it."""
    (root / "offsets").mkdir(parents=True)
    for batch_id, offsets in ends.items():
        (root / "offsets" / str(batch_id)).write_text(
            _OFFSETS_HEADER + orjson.dumps(offsets).decode()
        )
    return root


def _table(client: redis.Redis, target: FoldTarget) -> dict[str, object]:
    return dict(StateReader(client, target.processor, target.key_prefix).scan("per_minute", 1))


def test_a_batch_is_applied_once_by_its_batch_id(target: FoldTarget, redis_url, tmp_path):
    target = dataclasses.replace(target, processor="sales_native")
    checkpoint = _checkpoint(
        tmp_path / "cp",
        {
            2: {"orders": {"0": 5, "1": 6}},
            3: {"orders": {"0": 10, "1": 12}},
            4: {"orders": {"0": 15, "1": 12}},
        },
    )
    client = redis_client(redis_url)
    sink = DataFrameSink(target, "per_minute", checkpoint)
    sink(_Frame([("EUR:1", '{"count": 1}'), ("USD:1", '{"count": 2}')]), 3)
    first = {"EUR:1": {"count": 1}, "USD:1": {"count": 2}}
    assert _table(client, target) == first
    positions = {b"orders/0": b"10", b"orders/1": b"12", b"batch_id": b"3"}
    assert client.hgetall(target.keys.positions) == positions

    sink(_Frame([("EUR:1", '{"count": 99}')]), 3)  # the same batch, run again
    sink(_Frame([("EUR:1", '{"count": 98}')]), 2)  # an older one
    assert _table(client, target) == first
    assert client.hgetall(target.keys.positions) == positions
    assert sink.total.skipped_batches == 2

    sink(_Frame([("EUR:1", '{"count": 5}'), (None, "{}")]), 4)
    assert _table(client, target) == {"EUR:1": {"count": 5}, "USD:1": {"count": 2}}
    assert client.hgetall(target.keys.positions) == {
        b"orders/0": b"15",
        b"orders/1": b"12",
        b"batch_id": b"4",
    }
    assert (sink.total.rows, sink.total.no_key) == (3, 1)


def _arrow_of(columns) -> pa.Schema:
    """OrderPaid's events as Spark's ``to_arrow_schema`` gives them (no JVM needed here)."""
    types = {
        "STRING": pa.string(),
        "BIGINT": pa.int64(),
        "INT": pa.int32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([(c.name, types[c.ddl]) for c in columns])


def test_the_decode_task_types_its_events_and_dead_letters_the_rest(
    target: FoldTarget, kafka_bootstrap
):
    codec = EventCodec()
    columns = event_columns([codec.reader_for("OrderPaid").raw])
    plan = DecodePlan(target, codec, ("OrderPaid",), columns, _arrow_of(columns))
    paid = {
        "event_id": "e1",
        "order_id": "o1",
        "amount_minor": 1250,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": 1_767_225_600_123,
    }
    placed = {
        "event_id": "e0",
        "order_id": "o1",
        "customer_id": "c1",
        "lines": [],
        "currency": "EUR",
        "placed_at": 1_767_225_600_000,
    }
    values = [codec.encode("OrderPlaced", placed), codec.encode("OrderPaid", paid), b"not avro"]
    records = pa.RecordBatch.from_pydict(
        {
            "key": [b"o1"] * 3,
            "value": values,
            "topic": ["orders"] * 3,
            "partition": [2] * 3,
            "offset": [7, 8, 9],
            "timestamp": pa.array([1_000_000] * 3, pa.timestamp("us", tz="UTC")),
        }
    )
    try:
        out = list(_decode_task(plan, False, iter([records])))
    finally:
        dataframe._PRODUCERS.clear()  # the worker's cached producer: not past this test's broker
    assert len(out) == 1
    assert out[0].schema == plan.arrow
    assert out[0].to_pylist() == [
        {
            **paid,
            "paid_at": out[0].column("paid_at")[0].as_py(),
            "event_type": "OrderPaid",
            "topic": "orders",
            "partition": 2,
            "offset": 8,
        }
    ]
    assert out[0].column("paid_at").cast(pa.int64())[0].as_py() == paid["paid_at"] * 1000

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "t"})
    consumer.assign([TopicPartition(target.dlq_topic, 0, 0)])
    letters = []
    for _ in range(20):
        letters += [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
        if letters:
            break
    consumer.close()
    assert [m.value() for m in letters] == [b"not avro"]
    headers = {k: v.decode() for k, v in letters[0].headers()}
    assert headers["refold.reason"] == "bad-magic"
    assert headers["refold.origin.offset"] == "9"


def _paid(n: int) -> dict[str, object]:
    return {
        "event_id": f"e{n}",
        "order_id": f"o{n}",
        "amount_minor": 100 + n,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": 1_767_225_600_000 + n,
    }


def test_a_rebuild_does_not_send_the_live_generations_dead_letters_again(
    target: FoldTarget, redis_url, kafka_bootstrap, tmp_path
):
    """Dead letters once (issue 22 item 3) in the DataFrame engine: decode task + sink."""
    codec = EventCodec()
    columns = event_columns([codec.reader_for("OrderPaid").raw])
    base = dataclasses.replace(target, processor="sales_native")
    live, rebuild = base, dataclasses.replace(base, generation=2)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, base.processor, base.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    # Two partitions of 12 records; every third one does not decode.
    records = [
        (p, o, b"not avro" if o % 3 == 1 else codec.encode("OrderPaid", _paid(100 * p + o)))
        for p in (0, 1)
        for o in range(12)
    ]

    def decode(plan_target: FoldTarget, upto: int) -> int:
        chosen = [r for r in records if r[1] < upto]
        batch = pa.RecordBatch.from_pydict(
            {
                "key": [b"k"] * len(chosen),
                "value": [v for _p, _o, v in chosen],
                "topic": ["orders"] * len(chosen),
                "partition": [p for p, _o, _v in chosen],
                "offset": [o for _p, o, _v in chosen],
                "timestamp": pa.array([0] * len(chosen), pa.timestamp("us", tz="UTC")),
            }
        )
        plan = DecodePlan(plan_target, codec, ("OrderPaid",), columns, _arrow_of(columns))
        try:
            rows = list(_decode_task(plan, False, iter([batch])))
        finally:
            dataframe._PRODUCERS.clear()
        return sum(b.num_rows for b in rows)

    # Live: the first 8 offsets of each partition, decoded and applied by the sink.
    assert decode(live, 8) == 2 * 5
    checkpoint = _checkpoint(tmp_path / "cp1", {0: {"orders": {"0": 8, "1": 8}}})
    DataFrameSink(live, "per_minute", checkpoint)(_Frame([("EUR:1", '{"count": 10}')]), 0)
    by_live = dlq_letters(kafka_bootstrap, base.dlq_topic)
    assert sorted((p, o) for p, o, _r, _g in by_live) == [(p, o) for p in (0, 1) for o in (1, 4, 7)]

    # A rebuild of the whole log: only the letters past the live positions are sent, by it.
    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    assert decode(rebuild, 12) == 2 * 8
    after = dlq_letters(kafka_bootstrap, base.dlq_topic)
    new = after[len(by_live) :]
    assert sorted((p, o, g) for p, o, _r, g in new) == [(0, 10, 2), (1, 10, 2)]
    assert all(r == "bad-magic" for _p, _o, r, _g in after)
    # Each generation's index holds every letter it decided, sent or not.
    index = {
        g: {k.decode(): v.decode() for k, v in client.hgetall(t.keys.dead_letters).items()}
        for g, t in ((1, live), (2, rebuild))
    }
    assert index[1] == {f"orders/{p}@{o}.0": "bad-magic" for p in (0, 1) for o in (1, 4, 7)}
    assert index[2] == {f"orders/{p}@{o}.0": "bad-magic" for p in (0, 1) for o in (1, 4, 7, 10)}

    # A re-run decode task of the live generation sends nothing again either: every letter
    # sent is in the processor's dl:sent ledger, whichever generation sent it.
    decode(live, 8)
    assert len(dlq_letters(kafka_bootstrap, base.dlq_topic)) == len(after)
