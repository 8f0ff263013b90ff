"""Bad input on the event-time paths, against real Redis and a real broker: each record or
timer that cannot be used goes to the dead-letter topic with its reason and origin, the stream
goes on, and the state equals the oracle's.

- a window processor: an event without its event-time field (``no-event-time``), a late event
  beyond the retention under ``accept`` (``expired``), a ``measure()`` that raises
  (``fold-error``);
- an entity fold with timers: an ``on_timer`` that raises (``timer-error``: the record that
  fired it was applied, the entity keeps its state);
- a lookup processor: an ``enrich()`` that raises (``enrich-error``: removed from the pending
  set, counted nowhere).
"""

from __future__ import annotations

import dataclasses

import orjson

from refold.contracts.codec import EventCodec
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.processors import EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.customer_profiles.config import CUSTOMER_PROFILES
from refold.processors.customer_profiles.projection import CustomerProfilesProjection
from refold.processors.enriched_clicks.config import ENRICHED_CLICKS
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.oracle import fold_lookups, fold_timed, fold_windows
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldWriter
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.web_sessions.config import WEB_SESSIONS
from refold.processors.web_sessions.projection import WebSessionsProjection
from refold.services.reader.state_reader import StateReader
from tests.support.topics import read_to_end
from tests.support.windows import bucket_dump

CODEC = EventCodec()
BASE = 1_700_000_040_000  # a minute boundary
UNLUCKY = 13  # an amount the test fold refuses to measure


def _letters(bootstrap: str, topic: str) -> list[tuple[dict[str, bytes], bytes | None]]:
    return [(dict(m.headers()), m.value()) for m in read_to_end(bootstrap, topic)]


def _record(offset: int, event_type: str, event: dict, topic: str = "orders") -> SourceRecord:
    key = str(event.get("order_id") or event.get("session_id") or event["customer_id"])
    return SourceRecord(topic, 0, offset, key.encode(), CODEC.encode(event_type, event))


def _decoded(records):
    for r in records:
        event = CODEC.decode(r.value)
        yield position_field(r.topic, r.partition), r.offset, event.event_type, event.data


class _Picky(SalesWindows):
    """sales_windows that also counts placed orders (they have no paid_at) and refuses 13s."""

    event_types = ("OrderPaid", "OrderPlaced")

    def measure(self, event_type, event):
        if event["amount_minor"] == UNLUCKY:
            msg = "unlucky amount"
            raise ValueError(msg)
        return super().measure(event_type, event)


def _paid(order: str, at: int, amount: int = 100) -> tuple[str, dict]:
    return "OrderPaid", {
        "event_id": f"e-{order}",
        "order_id": order,
        "amount_minor": amount,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": at,
    }


def test_a_window_processor_dead_letters_what_it_cannot_count_and_goes_on(
    target, redis_url, kafka_bootstrap
):
    event_time = EventTime(field="paid_at", lateness_ms=0, late="accept", retention_ms=60_000)
    chosen = dataclasses.replace(
        target, processor="sales_windows", event_time=event_time, topics=("orders",)
    )
    placed = {
        "event_id": "p",
        "order_id": "o9",
        "customer_id": "c",
        "currency": "EUR",
        "placed_at": BASE,
        "lines": [{"sku": "SKU-1", "qty": 1, "unit_price_minor": 100}],
        "channel": "web",
    }
    events = [
        _paid("o1", BASE + 300_000),
        _paid("o2", BASE + 270_000),  # 30 s behind: late, accepted
        _paid("o3", BASE + 120_000),  # 3 min behind: beyond lateness and retention
        ("OrderPlaced", placed),  # counted type, but no paid_at
        _paid("o4", BASE + 301_000, amount=UNLUCKY),  # measure() raises
        _paid("o5", BASE + 302_000),
    ]
    records = [_record(i, t, e) for i, (t, e) in enumerate(events)]
    writer = FoldWriter(chosen, _Picky())
    for i, record in enumerate(records):
        writer.apply([record], batch_id=i)
    oracle = fold_windows(_Picky(), event_time, _decoded(records))
    client = redis_client(redis_url)
    assert bucket_dump(client, chosen.keys) == oracle.buckets
    per_minute = {s: b["count"] for (w, s, _g), b in oracle.buckets.items() if w == "per_minute"}
    assert sum(per_minute.values()) == 3  # o1, o2 (accepted late), o5
    reasons = {
        int(h["refold.origin.offset"]): h["refold.reason"].decode()
        for h, _v in _letters(kafka_bootstrap, target.dlq_topic)
    }
    assert reasons == {2: "expired", 3: "no-event-time", 4: "fold-error"}


class _Brittle(WebSessionsProjection):
    """web_sessions whose timer fails for session "bad"."""

    def on_timer(self, state, watermark):
        if state["session_id"] == "bad":
            msg = "cannot close"
            raise RuntimeError(msg)
        return super().on_timer(state, watermark)


def _view(offset: int, session: str, at: int) -> SourceRecord:
    event = {
        "event_id": f"v{offset}",
        "session_id": session,
        "visitor_id": "v",
        "url": "https://shop/",
        "path": "/",
        "page_type": "HOME",
        "device": "DESKTOP",
        "occurred_at": at,
    }
    return _record(offset, "PageViewed", event, topic="pv")


def test_a_failing_timer_is_a_letter_and_its_entity_keeps_its_state(
    target, redis_url, kafka_bootstrap, make_topic
):
    closed = make_topic(partitions=4, prefix="closed")
    fold = _Brittle(closed_topic=closed, gap_ms=60_000)
    chosen = dataclasses.replace(
        target, processor="web_sessions", event_time=WEB_SESSIONS.event_time, topics=("pv",)
    )
    later = BASE + 60_000 + WEB_SESSIONS.event_time.lateness_ms + 1
    records = [_view(0, "bad", BASE), _view(1, "good", BASE), _view(2, "other", later)]
    writer = FoldWriter(chosen, fold)
    for i, record in enumerate(records):
        writer.apply([record], batch_id=i)
    reader = StateReader(redis_client(redis_url), "web_sessions", target.key_prefix)
    states = dict(reader.scan("visits", 1))
    oracle = fold_timed(
        fold,
        WEB_SESSIONS.event_time,
        ("pv",),
        ((r.topic, r.partition, r.offset, *_decoded([r]).__next__()[2:]) for r in records),
    )
    assert states == oracle.states
    assert states["good"]["closed"] == 1
    assert states["bad"]["closed"] == 0  # kept as it was
    assert [entity for entity, reason in oracle.rejected if "timer-error" in reason] == ["bad"]
    letters = _letters(kafka_bootstrap, target.dlq_topic)
    assert len(letters) == 1
    headers, value = letters[0]
    assert headers["refold.reason"] == b"timer-error"
    assert headers["refold.timer"] == b"1"
    assert headers["refold.origin.offset"] == b"2"  # the record that fired it (applied)
    assert "cannot close" in orjson.loads(value)["timer"]


class _Fussy(EnrichedClicksProjection):
    """enriched_clicks that fails on the clicks of customer "cus-bad"."""

    def enrich(self, event_type, event, row, at):
        if event.get("customer_id") == "cus-bad":
            msg = "no such tier"
            raise KeyError(msg)
        return super().enrich(event_type, event, row, at)


def _click(offset: int, customer: str | None, at: int) -> SourceRecord:
    event = {
        "event_id": f"c{offset}",
        "session_id": f"s{offset}",
        "visitor_id": "v",
        "customer_id": customer,
        "search_id": "q",
        "position": 1,
        "sku": "SKU-1",
        "url": "https://shop/p/1",
        "occurred_at": at,
    }
    return _record(offset, "SearchResultClicked", event, topic="se")


def test_a_failing_lookup_is_a_letter_and_the_others_join(target, redis_url, kafka_bootstrap):
    client = redis_client(redis_url)
    prefix = target.key_prefix
    tables = GenerationRegistry.of(client, "customer_profiles", prefix)
    live = tables.create({"topics": ["crm"]}, live=True)
    tables.set_positions(live, {position_field("crm", 0): 0})
    table = dataclasses.replace(
        target,
        processor="customer_profiles",
        event_time=CUSTOMER_PROFILES.event_time,
        topics=("crm",),
    )
    profiles = []
    for i, customer in enumerate(("cus-ok", "cus-bad")):
        event = {
            "event_id": f"r{i}",
            "customer_id": customer,
            "email": f"{customer}@x",
            "name": customer,
            "country": "NL",
            "tier": "GOLD",
            "registered_at": BASE,
        }
        profiles.append(_record(i, "CustomerRegistered", event, topic="crm"))
    # A late registration moves the table's clock far on: its watermark passes the clicks.
    far = dict(CODEC.decode(profiles[0].value).data, event_id="r9", customer_id="cus-far")
    far["registered_at"] = BASE + 3_600_000
    profiles.append(_record(2, "CustomerRegistered", far, topic="crm"))
    FoldWriter(table, CustomerProfilesProjection()).apply(profiles)

    layout = StateLayout("enriched_clicks", prefix)
    GenerationRegistry(client, layout).create({"topics": ["se"]}, live=True)
    joined = dataclasses.replace(
        target, processor="enriched_clicks", event_time=ENRICHED_CLICKS.event_time, topics=("se",)
    )
    clicks = [
        _click(0, "cus-ok", BASE + 1),
        _click(1, "cus-bad", BASE + 2),
        _click(2, None, BASE + 3),
    ]
    FoldWriter(joined, _Fussy()).apply(clicks)
    joiner = LookupJoiner(
        layout,
        1,
        _Fussy(),
        ENRICHED_CLICKS.event_time,
        CUSTOMER_PROFILES.event_time.lateness_ms,
        redis_url,
        {"bootstrap.servers": kafka_bootstrap},
        target.dlq_topic,
    )
    joiner.run()
    totals = StateReader(client, "enriched_clicks", prefix).aggregate("clicks_by_customer").value
    rows = {
        s["customer_id"]: s
        for s in fold_timed(
            CustomerProfilesProjection(),
            CUSTOMER_PROFILES.event_time,
            ("crm",),
            ((r.topic, r.partition, r.offset, *_decoded([r]).__next__()[2:]) for r in profiles),
        ).states.values()
    }
    oracle = fold_lookups(
        _Fussy(),
        ENRICHED_CLICKS.event_time,
        ((r.topic, r.partition, r.offset, *_decoded([r]).__next__()[2:]) for r in clicks),
        rows,
        BASE + 3_600_000 - CUSTOMER_PROFILES.event_time.lateness_ms,
    )
    assert (
        totals
        == dict(oracle.aggregate)
        == {"clicks": 2, "anonymous": 1, "tier:GOLD": 1, "country:NL": 1}
    )
    assert [offset for _p, offset, _e in oracle.failed] == [1]
    assert client.zcard(layout.generation(1).timers("lookup")) == 0  # none left waiting
    letters = _letters(kafka_bootstrap, target.dlq_topic)
    assert [(h["refold.reason"], h["refold.origin.offset"]) for h, _v in letters] == [
        (b"enrich-error", b"1")
    ]
