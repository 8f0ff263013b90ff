"""``refold dlq redrive`` (issue 22 item 3): bad records back on their topic after a fix, once.

Real Redis and a real broker, the processor's writer without Spark: old code refuses some
orders (their events go to the dead-letter topic, with their own headers); after the fix a
redrive puts exactly those records back on the orders topic, byte for byte, on their
partitions and in their order; a second redrive sends nothing; the fixed writer folds the
copies, and the state equals the plain-Python fold of every event. A redrive that dies between
the Kafka commit and its Redis mark does not send again when run once more.
"""

from __future__ import annotations

import json
import zlib

import pytest
from confluent_kafka import Producer

from refold.contracts.codec import EventCodec
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.cli import main as refold_main
from refold.deploy.dlq_redrive import Redriver, Selection, read_letters
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import EventRejectedError, State
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.reader.state_reader import StateReader

PARTITIONS = 2


class RefusingOrderState(OrderStateProjection):
    """The old code: refuses every event of some orders (a rule the fix drops)."""

    def __init__(self, refused: set[str]) -> None:
        super().__init__()
        self.refused = refused

    def apply(self, state: State | None, event_type: str, event: dict) -> State:  # type: ignore[override]
        if event["order_id"] in self.refused:
            msg = "orders of this customer are refused"
            raise EventRejectedError(msg)
        return super().apply(state, event_type, event)


def _publish(bootstrap: str, topic: str, events: list[tuple[str, dict]]) -> None:
    """The events keyed by order, each with headers of its own (a duplicate name, a null)."""
    codec = EventCodec()
    producer = Producer({"bootstrap.servers": bootstrap})
    for n, (event_type, event) in enumerate(events):
        key = event["order_id"].encode()
        headers = [("trace", f"t-{n}".encode()), ("hop", b"a"), ("hop", b"\x00\xff"), ("x", None)]
        partition = zlib.crc32(key) % PARTITIONS
        producer.produce(topic, codec.encode(event_type, event), key, partition, headers=headers)
    assert producer.flush(30) == 0


def _records(bootstrap: str, topic: str) -> list[SourceRecord]:
    kafka = {"bootstrap.servers": bootstrap}
    return [SourceRecord.of_message(m) for chunk in read_log(kafka, topic) for m in chunk]


def _ends(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    with LogOffsets({"bootstrap.servers": bootstrap}) as offsets:
        return offsets.end_offsets([(topic, p) for p in range(PARTITIONS)])


def _copies(bootstrap: str, topic: str, ends: dict[tuple[str, int], int]) -> list[SourceRecord]:
    """The records past ``ends``: what a redrive produced."""
    return [r for r in _records(bootstrap, topic) if r.offset >= ends[r.topic, r.partition]]


def _redrive(capsys, *args: str) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = refold_main(["dlq", "redrive", "--processor", "order_state", *args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


@pytest.fixture
def env(target: FoldTarget, redis_url, kafka_bootstrap, monkeypatch) -> None:
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", target.key_prefix)
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC", target.dlq_topic)


def test_a_redrive_puts_the_refused_records_back_once_and_the_fixed_code_folds_them(
    target: FoldTarget, redis_url, kafka_bootstrap, make_topic, env, capsys
):
    orders = make_topic(partitions=PARTITIONS, prefix="orders")
    target = FoldTarget(
        target.processor, 1, redis_url, target.key_prefix, target.kafka, target.dlq_topic
    )
    events = list(OrderSimulator(80, seed=4, anomaly_rate=0))
    refused = {e["order_id"] for _t, e in events[::9]}
    _publish(kafka_bootstrap, orders, events)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    assert registry.create({"topics": [orders]}, live=True) == 1
    log = _records(kafka_bootstrap, orders)
    bad = [r for r in log if r.key is not None and r.key.decode() in refused]
    assert len(bad) > 10  # the premise: several orders, with several events each

    FoldWriter(target, RefusingOrderState(refused)).apply(log, batch_id=0)
    before = _ends(kafka_bootstrap, orders)

    # The fix is deployed; first look at what a redrive would send.
    code, dry, _err = _redrive(capsys, "--reason", "rejected", "--dry-run")
    assert code == 0
    origins = [f"{r.topic}/{r.partition}@{r.offset}" for r in bad]
    assert sorted(x["origin"] for x in dry["would_send"]) == sorted(origins)
    assert _ends(kafka_bootstrap, orders) == before  # a dry run sends nothing

    code, done, _err = _redrive(capsys, "--reason", "rejected")
    assert code == 0
    assert len(done["sent"]) == len(bad)
    after = _ends(kafka_bootstrap, orders)
    copies = [
        r for r in _records(kafka_bootstrap, orders) if r.offset >= before[r.topic, r.partition]
    ]
    # Byte for byte, on the record's own partition, in its partition's order.
    shape = lambda rs: [(r.partition, r.key, r.value, r.headers) for r in rs]  # noqa: E731
    assert sorted(shape(copies), key=lambda s: s[0]) == sorted(shape(bad), key=lambda s: s[0])
    assert all(r.headers and ("x", None) in r.headers for r in copies)

    # Once: the same redrive again sends nothing.
    code, again, _err = _redrive(capsys, "--reason", "rejected")
    assert (code, again["sent"], again["skipped"]["already_redriven"]) == (0, [], len(bad))
    assert _ends(kafka_bootstrap, orders) == after

    # The fixed code folds the copies: live state == the plain fold of every event.
    FoldWriter(target, OrderStateProjection()).apply(copies, batch_id=1)
    oracle = fold_all(OrderStateProjection(), events)
    reader = StateReader(client, "order_state", target.key_prefix)
    assert dict(reader.scan("orders", generation=1)) == oracle.states
    assert reader.aggregate("order_totals", generation=1).value == dict(oracle.aggregate)

    # Useful errors: nothing matches, an unknown processor, no selection.
    code, _out, err = _redrive(capsys, "--reason", "no-such-reason")
    assert code == 1
    assert f"no dead letter of order_state on {target.dlq_topic} matches --reason" in err
    assert refold_main(["dlq", "redrive", "--processor", "nope", "--all"]) == 1
    assert "unknown processor nope" in capsys.readouterr().err
    assert refold_main(["dlq", "redrive", "--processor", "order_state"]) == 2


def test_a_redrive_that_died_before_its_mark_does_not_send_again(
    target: FoldTarget, redis_url, kafka_bootstrap, make_topic, monkeypatch
):
    orders = make_topic(partitions=PARTITIONS, prefix="orders")
    events = list(OrderSimulator(10, seed=6, anomaly_rate=0))
    _publish(kafka_bootstrap, orders, events)
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition in range(PARTITIONS):
        raw.produce(orders, b"not avro", b"k", partition, headers=[("h", b"1")])
    raw.flush(30)
    client = redis_client(redis_url)
    GenerationRegistry.of(client, "order_state", target.key_prefix).create({}, live=True)
    FoldWriter(target, OrderStateProjection()).apply(_records(kafka_bootstrap, orders), 0)
    before = _ends(kafka_bootstrap, orders)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    redriver = Redriver(kafka, client, target.layout)
    selection = Selection("order_state", frozenset({"bad-magic"}))

    real_mark = Redriver._mark

    def dies_before_sent(self, letters, state, where):
        if state == "sent":
            msg = "killed between the Kafka commit and the Redis mark"
            raise OSError(msg)
        real_mark(self, letters, state, where)

    with monkeypatch.context() as patch:
        patch.setattr(Redriver, "_mark", dies_before_sent)
        with pytest.raises(OSError, match="killed"):
            redriver.run(read_letters(kafka, target.dlq_topic), selection)
    committed = _ends(kafka_bootstrap, orders)
    assert sum(committed.values()) > sum(before.values())  # the copies were committed
    marks = client.hgetall(target.layout.redriven)
    assert {json.loads(v)["state"] for v in marks.values()} == {"pending"}

    report = redriver.run(read_letters(kafka, target.dlq_topic), selection)
    assert (report.sent, report.already) == ([], PARTITIONS)  # found on the log: not again
    assert _ends(kafka_bootstrap, orders) == committed
    marks = client.hgetall(target.layout.redriven)
    assert {json.loads(v)["state"] for v in marks.values()} == {"sent"}
    copies = [
        r for r in _records(kafka_bootstrap, orders) if r.offset >= before[r.topic, r.partition]
    ]
    assert [(r.value, r.headers) for r in copies] == [(b"not avro", (("h", b"1"),))] * PARTITIONS
