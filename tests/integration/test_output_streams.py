"""Output streams with contracts: processors chain, exactly once downstream by origin ids.

order_state publishes ``OrderStatusChanged`` records (Avro) keyed by customer_id; a processor of
customers folds them. The upstream sends some of its outputs again, as a crash between its
produce and its commit, or a replay's cutover overlap, does: the downstream state still counts
every status change exactly once, equal to a plain fold of the upstream's changes.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import Counter
from typing import Any

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.errors import EventValidationError
from refold.contracts.origin import parse_origin_id
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_orders.projection import CustomerOrdersProjection
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import (
    InvalidOutputError,
    SideEffect,
    encode_effects,
)
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.reader.state_reader import StateReader
from tests.support.chain import status_changes

CODEC = EventCodec()
PARTITIONS = 4


def _orders(count: int, seed: int) -> tuple[list[tuple[str, dict[str, Any]]], list[SourceRecord]]:
    """Order events and their records on a 4-partition topic ``orders``, in publishing order."""
    events = list(OrderSimulator(count, seed=seed))
    offsets: Counter[int] = Counter()
    records = []
    for event_type, event in events:
        partition = zlib.crc32(event["order_id"].encode()) % PARTITIONS
        records.append(
            SourceRecord(
                "orders",
                partition,
                offsets[partition],
                event["order_id"].encode(),
                CODEC.encode(event_type, event),
            )
        )
        offsets[partition] += 1
    return events, records


def _in_chunks(writer: FoldWriter, records: list[SourceRecord], rng: random.Random) -> int:
    """Apply in random chunks, then the last chunk again (a replayed batch); duplicates seen."""
    duplicates, i, batch = 0, 0, 0
    while i < len(records):
        size = rng.randint(1, 150)
        duplicates += writer.apply(records[i : i + size], batch_id=batch).duplicates
        i, batch = i + size, batch + 1
    assert writer.apply(records[-50:], batch_id=batch).applied == 0
    return duplicates


def test_a_chained_processor_applies_each_upstream_output_once(
    target: FoldTarget, redis_url: str, kafka_bootstrap: str, make_topic
) -> None:
    events, records = _orders(300, seed=21)
    changes = make_topic(partitions=3, prefix="changes")
    notices = make_topic(partitions=1, prefix="notices")
    upstream = OrderStateProjection(notifications_topic=notices, changes_topic=changes)
    rng = random.Random(4)
    _in_chunks(FoldWriter(target, upstream), records, rng)
    # The same processor sends a part again from a fresh state (as after a crash between its
    # produce and its commit): the same origin ids, after the originals of each stream.
    again = dataclasses.replace(target, key_prefix=f"{target.key_prefix}-again")
    resent = [r for r in records if r.offset < 40]
    _in_chunks(FoldWriter(again, upstream), resent, rng)

    kafka = dict(target.kafka)
    log = [SourceRecord.of_message(m) for chunk in read_log(kafka, changes) for m in chunk]
    ids = [r.origin for r in log]
    assert all(parse_origin_id(i) is not None for i in ids)
    assert len(ids) > len(set(ids))  # the re-sent outputs are on the topic
    decoded = [CODEC.decode(r.value) for r in log]
    assert {d.event_type for d in decoded} == {"OrderStatusChanged"}
    assert all(r.key == d.data["customer_id"].encode() for r, d in zip(log, decoded, strict=True))

    downstream = dataclasses.replace(target, processor="customer_orders", topics=(changes,))
    by_partition: dict[int, list[SourceRecord]] = {}
    for record in log:
        by_partition.setdefault(record.partition, []).append(record)
    shuffled = [r for p in sorted(by_partition) for r in by_partition[p]]
    skipped = _in_chunks(FoldWriter(downstream, CustomerOrdersProjection()), shuffled, rng)
    assert skipped == len(ids) - len(set(ids))

    reader = StateReader(redis_client(redis_url), "customer_orders", target.key_prefix)
    states = dict(reader.scan("customers", 1))
    wanted = status_changes(events)
    got = Counter(
        {(c, s): n for c, state in states.items() for s, n in state["entered"].items() if n}
    )
    assert got == wanted
    # == a plain fold of the log with each origin id once
    first: dict[str, tuple[str, dict[str, Any]]] = {}
    for record, event in zip(log, decoded, strict=True):
        first.setdefault(str(record.origin), (event.event_type, event.data))
    assert states == fold_all(CustomerOrdersProjection(), first.values()).states


def test_an_output_that_breaks_its_contract_dead_letters_its_record() -> None:
    good = SideEffect("t", "k", {"order_id": "o"}, contract=None)
    assert encode_effects([good])[0].payload == b'{"order_id":"o"}'
    bad = SideEffect("t", "k", {"order_id": "o", "status": 3}, contract="OrderStatusChanged")
    with pytest.raises(InvalidOutputError) as caught:
        encode_effects([bad])
    assert isinstance(caught.value.__cause__, EventValidationError)
    assert "OrderStatusChanged" in str(caught.value)


class _BrokenChanges(OrderStateProjection):
    """order_state whose change record of a cancellation breaks its contract (a bug)."""

    def effects(self, event_type, event, before, after):
        out = list(super().effects(event_type, event, before, after))
        return [
            SideEffect(e.topic, e.key, {**e.value, "total_minor": "n/a"}, e.contract)
            if e.contract and e.value["status"] == "cancelled"
            else e
            for e in out
        ]


def test_a_record_whose_output_breaks_its_contract_is_a_dead_letter(
    target: FoldTarget, kafka_bootstrap: str, redis_url: str, make_topic
) -> None:
    events, records = _orders(200, seed=5)
    changes = make_topic(partitions=3, prefix="changes")
    notices = make_topic(partitions=1, prefix="notices")
    projection = _BrokenChanges(notifications_topic=notices, changes_topic=changes)
    outcome = FoldWriter(target, projection).apply(records, batch_id=0)

    oracle = fold_all(projection, events)  # the same rule: the record is not applied
    cancels = [r for r in oracle.rejected if "OUTPUT_INVALID" in r[1]]
    assert cancels, "some orders were cancelled"
    reader = StateReader(redis_client(redis_url), "order_state", target.key_prefix)
    assert dict(reader.scan("orders", 1)) == oracle.states
    assert outcome.rejected >= len(cancels)
    kafka = dict(target.kafka)
    letters = [m for chunk in read_log(kafka, target.dlq_topic) for m in chunk]
    reasons = [dict(m.headers())["refold.reason"] for m in letters]
    assert reasons.count(b"invalid-output") == len(cancels)
    changed = [CODEC.decode(m.value()).data for c in read_log(kafka, changes) for m in c]
    assert changed
    assert all(c["status"] != "cancelled" for c in changed)
