"""Pattern processors through the envelope, against real Redis and a broker (no Spark).

order_alerts (an absence and a sequence per order, over commerce.orders' 8 partitions) and
customer_alerts (a count per customer over order_state's status changes, out of order the way
an upstream's parallel tasks write them, with repeated records) equal their oracle
(``fold_timed``): states, aggregates and the insights on the insights topic, each a record of
the Insight contract, whatever the chunking and the interleaving of the partitions, and a
replayed batch changes nothing.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from refold.contracts.codec import MAGIC, EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.origin import ORIGIN_ID
from refold.contracts.processors import ProcessorOptions
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_alerts.config import CUSTOMER_ALERTS
from refold.processors.customer_alerts.projection import build as build_customer_alerts
from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.patterns import PatternOptions
from refold.processors.fold.records import SourceRecord
from refold.processors.order_alerts.config import ORDER_ALERTS
from refold.processors.order_alerts.projection import build as build_order_alerts
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.services.reader.state_reader import StateReader
from tests.support.topics import interleaved, random_chunks, read_to_end

CODEC = EventCodec()
PARTITIONS = 8
# customer_alerts over a derived topic *without* watermark markers, judged per raw partition:
# the lateness must cover the upstream's batch span (12 hours, as before the markers; with
# them, tests/integration/test_chain_watermarks.py runs it at its own one minute).
LATENESS_MS = 12 * 3_600_000
RAW_ALERTS = dataclasses.replace(
    CUSTOMER_ALERTS,
    event_time=dataclasses.replace(CUSTOMER_ALERTS.event_time, lateness_ms=LATENESS_MS),
)


def _records(topic: str, events, key_field: str) -> list[SourceRecord]:
    """The events as one topic's log, keyed by ``key_field``: records in publishing order."""
    offsets: dict[int, int] = {}
    out = []
    for event_type, event in events:
        key = event[key_field].encode()
        partition = zlib.crc32(key) % PARTITIONS
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        out.append(SourceRecord(topic, partition, offset, key, CODEC.encode(event_type, event)))
    return out


def _oracle_input(records):
    for r in records:
        decoded = CODEC.decode(r.value)
        yield r.topic, r.partition, r.offset, decoded.event_type, decoded.data


def _run(target, projection, records, rng=None):
    writer = FoldWriter(target, projection)
    if rng is None:
        writer.apply(records, batch_id=0)
        return
    chunks = random_chunks(records, rng, 400)
    for batch, chunk in enumerate(chunks):
        writer.apply(chunk, batch_id=batch)
    outcome = writer.apply(records, batch_id=len(chunks))  # a replayed batch changes nothing
    assert (outcome.applied, outcome.effects) == (0, 0)


def _insights(bootstrap: str, topic: str) -> dict[str, dict]:
    """The insights on ``topic`` by id, each checked against the Insight contract."""
    seen: dict[str, dict] = {}
    for message in read_to_end(bootstrap, topic):
        value = message.value()
        assert value.startswith(MAGIC)  # Avro, written with its contract: not JSON
        decoded = CODEC.decode(value)
        assert decoded.event_type == "Insight"
        insight = decoded.data
        assert message.key().decode() == insight["key"]
        headers = dict(message.headers() or [])
        assert headers[ORIGIN_ID].decode().startswith(f"{insight['processor']}|")
        assert seen.setdefault(insight["insight_id"], insight) == insight  # at least once
    return seen


def _target(base: FoldTarget, spec, topic: str, generation: int) -> FoldTarget:
    return dataclasses.replace(
        base,
        processor=spec.name,
        generation=generation,
        event_time=spec.event_time,
        topics=(topic,),
        check_keys=True,
    )


def test_order_alerts_equal_the_oracle_whatever_the_chunks(
    target, redis_url, kafka_bootstrap, make_topic
):
    orders = make_topic(partitions=PARTITIONS, prefix="orders")
    records = _records(orders, OrderSimulator(1_500, seed=11), ORDERS.key_field)
    oracle = fold_timed(
        build_order_alerts(ProcessorOptions()),
        ORDER_ALERTS.event_time,
        (orders,),
        _oracle_input(records),
    )
    want = {e.value["insight_id"]: e.value for e in oracle.effects}
    kinds = {i["pattern"] for i in want.values()}
    assert kinds == {"paid_not_shipped", "paid_then_cancelled"}, kinds
    reader = StateReader(redis_client(redis_url), "order_alerts", target.key_prefix)
    for generation, seed in ((1, None), (2, 5), (3, 6)):
        topic = make_topic(partitions=4, prefix="insights")
        projection = build_order_alerts(PatternOptions(insights_topic=topic))
        log = records if seed is None else interleaved(records, random.Random(seed))
        rng = None if seed is None else random.Random(seed)
        _run(_target(target, ORDER_ALERTS, orders, generation), projection, log, rng)
        assert dict(reader.scan("patterns", generation)) == oracle.states, generation
        totals = reader.aggregate("insight_counts", generation).value
        assert totals == dict(oracle.aggregate), generation
        assert _insights(kafka_bootstrap, topic) == want, generation
    assert oracle.late == []
    assert oracle.rejected == []


def _status_changes(events):
    """order_state's output for the simulator's orders: an OrderStatusChanged per status move,
    keyed by customer (the simulator's anomalies, which order_state rejects, move nothing)."""
    orders: dict[str, dict] = {}
    moves = {
        "OrderPaid": ("paid", "paid_at"),
        "OrderShipped": ("shipped", "shipped_at"),
        "OrderCancelled": ("cancelled", "cancelled_at"),
    }
    for event_type, event in events:
        if event_type == "OrderPlaced":
            orders[event["order_id"]] = order = {
                "order_id": event["order_id"],
                "customer_id": event["customer_id"],
                "status": "placed",
                "previous_status": None,
                "currency": event["currency"],
                "total_minor": sum(li["qty"] * li["unit_price_minor"] for li in event["lines"]),
                "changed_at": event["placed_at"],
            }
            yield order["order_id"], dict(order)
        elif event_type in moves:
            order = orders[event["order_id"]]
            status, field = moves[event_type]
            if order["status"] in ("shipped", "cancelled") or (
                status == "shipped" and order["status"] != "paid"
            ):
                continue
            order.update(previous_status=order["status"], status=status)
            order["changed_at"] = event[field]
            yield order["order_id"], dict(order)


def _upstream_log(changes, rng):
    """The changes as an upstream with parallel tasks writes them: batch by batch, each batch's
    changes grouped by the order's source partition (a task folds its partitions one after the
    other), so a partition's records go back in event time by up to a batch's span; a few
    batches are written twice (a task re-run after a crash: at least once)."""
    out = []
    for start in range(0, len(changes), 3_000):
        batch = changes[start : start + 3_000]
        by_source: dict[int, list] = {}
        for order_id, change in batch:
            by_source.setdefault(zlib.crc32(order_id.encode()) % PARTITIONS, []).append(change)
        groups = list(by_source.values())
        rng.shuffle(groups)
        written = [c for group in groups for c in group]
        out += written
        if rng.random() < 0.3:
            out += written[: rng.randint(1, len(written))]
    return out


def _heartbeats(at: int) -> list[dict]:
    """One change on every partition at ``at``, of customers of their own."""
    out = []
    for partition in range(PARTITIONS):
        customer = next(
            f"cus-x{n}"
            for n in range(1_000)
            if zlib.crc32(f"cus-x{n}".encode()) % PARTITIONS == partition
        )
        out.append(
            {
                "order_id": f"ord-x{partition}",
                "customer_id": customer,
                "status": "placed",
                "previous_status": None,
                "currency": "EUR",
                "total_minor": 100,
                "changed_at": at,
            }
        )
    return out


def _by_id(result) -> dict[str, dict]:
    return {e.value["insight_id"]: e.value for e in result.effects}


def test_customer_alerts_over_an_upstream_s_out_of_order_output_equal_the_oracle(
    target, redis_url, kafka_bootstrap, make_topic
):
    topic = make_topic(partitions=PARTITIONS, prefix="changes")
    changes = list(_status_changes(OrderSimulator(3_000, seed=4)))
    # One more change on every partition, the lateness past the end: every match settles.
    tail = _heartbeats(max(c["changed_at"] for _o, c in changes) + LATENESS_MS + 1)
    written = _upstream_log(changes, random.Random(8)) + tail
    assert len(written) > len(changes) + len(tail)  # some really were written twice
    records = _records(topic, [("OrderStatusChanged", c) for c in written], "customer_id")
    projection = build_customer_alerts(ProcessorOptions())
    oracle = fold_timed(projection, RAW_ALERTS.event_time, (topic,), _oracle_input(records))
    assert oracle.late == []
    # The same insights as from the changes written once, in event-time order.
    in_order = sorted((c for _o, c in changes), key=lambda c: c["changed_at"]) + tail
    once = _records(topic, [("OrderStatusChanged", c) for c in in_order], "customer_id")
    clean = fold_timed(projection, RAW_ALERTS.event_time, (topic,), _oracle_input(once))
    want = _by_id(oracle)
    assert want == _by_id(clean)
    assert len(want) >= 5, len(want)
    assert {i["event_count"] for i in want.values()} == {2}

    reader = StateReader(redis_client(redis_url), "customer_alerts", target.key_prefix)
    for generation, seed in ((1, None), (2, 3)):
        insights = make_topic(partitions=4, prefix="insights")
        projection = build_customer_alerts(PatternOptions(insights_topic=insights))
        log = records if seed is None else interleaved(records, random.Random(seed))
        rng = None if seed is None else random.Random(seed)
        _run(_target(target, RAW_ALERTS, topic, generation), projection, log, rng)
        assert dict(reader.scan("patterns", generation)) == oracle.states, generation
        totals = reader.aggregate("insight_counts", generation).value
        assert totals == dict(oracle.aggregate), generation
        assert _insights(kafka_bootstrap, insights) == want, generation
