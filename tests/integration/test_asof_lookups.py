"""Lookups by event time with a late table update and bounded versions, against real Redis and a
real broker: live == oracle == replay.

A customer's tier changes while their clicks are already in the lookup processor's pending set,
and one change reaches the table's log after newer account events (late, but within the table's
lateness): every click still gets the tier its customer had at the click's time, because it
waits for the table's watermark. A change later than the table's lateness is dead-lettered by
the table in every run, so no click ever sees it. Another customer changes tier more often than
the table keeps versions: the table drops the oldest in its fold (in its transaction), and
live, the oracle and a replay keep the same versions.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections import Counter

from refold.contracts.codec import EventCodec
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.windows import watermark_of
from refold.processors.customer_profiles.config import CUSTOMER_PROFILES
from refold.processors.customer_profiles.projection import CustomerProfilesProjection
from refold.processors.enriched_clicks.config import ENRICHED_CLICKS
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.lookups import EXPIRED, VersionRetention, as_of
from refold.processors.fold.oracle import fold_lookups, fold_timed
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldWriter
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.services.reader.state_reader import StateReader

CODEC = EventCodec()
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
PARTITIONS = 4
RETENTION = VersionRetention(max_versions=3, horizon_ms=24 * 60 * MIN)
B_TIERS = ["STANDARD", "SILVER", "GOLD", "SILVER", "GOLD", "PLATINUM", "GOLD"]


def _id() -> str:
    return str(uuid.uuid4())


def _registered(customer: str, tier: str, at: int) -> tuple[str, dict]:
    return "CustomerRegistered", {
        "event_id": _id(),
        "customer_id": customer,
        "email": f"{customer}@example.com",
        "name": customer.upper(),
        "country": "NL",
        "tier": tier,
        "visitor_id": None,
        "registered_at": at,
    }


def _changed(customer: str, at: int, tier: str | None = None, country: str | None = None):
    return "ProfileChanged", {
        "event_id": _id(),
        "customer_id": customer,
        "email": None,
        "name": None,
        "country": country,
        "tier": tier,
        "changed_at": at,
    }


def _click(session: str, customer: str | None, at: int) -> tuple[str, dict]:
    return "SearchResultClicked", {
        "event_id": _id(),
        "session_id": session,
        "visitor_id": f"v-{session}",
        "customer_id": customer,
        "search_id": _id(),
        "position": 1,
        "sku": "SKU-0001",
        "url": "https://shop.example/p/SKU-0001",
        "occurred_at": at,
    }


def _table_log() -> dict[int, list[tuple[str, dict]]]:
    """crm.customers, per partition in log order."""
    return {
        0: [
            _registered("cus-a", "SILVER", T0),
            _changed("cus-a", T0 + 10 * MIN, tier="GOLD"),
            _registered("cus-c", "STANDARD", T0 + 20 * MIN + 50_000),
            # Late by 50 s on its partition, within the table's minute of lateness: kept.
            _changed("cus-a", T0 + 20 * MIN, tier="PLATINUM"),
            _changed("cus-c", T0 + 30 * MIN, country="DE"),
            # Late by 5 minutes: the table dead-letters it, in every run.
            _changed("cus-a", T0 + 25 * MIN, tier="STANDARD"),
            _changed("cus-c", T0 + 60 * MIN, country="FR"),
        ],
        1: [
            _registered("cus-b", B_TIERS[0], T0),
            *(_changed("cus-b", T0 + i * MIN, tier=t) for i, t in enumerate(B_TIERS[1:], 1)),
            _registered("cus-f", "SILVER", T0 + 12 * MIN),
            *(_changed("cus-f", T0 + m * MIN, country=c) for m, c in ((26, "DE"), (45, "FR"))),
            _changed("cus-b", T0 + 60 * MIN, country="BE"),
        ],
        2: [
            _registered("cus-d", "GOLD", T0),
            *(_changed("cus-d", T0 + m * MIN, country=c) for m, c in ((14, "DE"), (31, "FR"))),
            _changed("cus-d", T0 + 60 * MIN, country="DE"),
        ],
        3: [
            _registered("cus-e", "GOLD", T0),
            *(_changed("cus-e", T0 + m * MIN, country=c) for m, c in ((9, "DE"), (24, "FR"))),
            _changed("cus-e", T0 + 61 * MIN, country="DE"),
        ],
    }


def _click_log() -> dict[int, list[tuple[str, dict]]]:
    """web.searches' clicks, per partition in log order (customer a's sessions on 0 and 1)."""
    return {
        0: [
            _click("s-a1", "cus-a", T0 + 5 * MIN),  # SILVER
            _click("s-a1", "cus-a", T0 + 22 * MIN),  # PLATINUM: the late change
            _click("s-a1", "cus-a", T0 + 18 * MIN),  # GOLD (4 min late: within the 5)
        ],
        1: [
            _click("s-a2", "cus-a", T0 + 27 * MIN),  # PLATINUM: the refused change never counts
            _click("s-b1", "cus-b", T0 + 30 * MIN),  # b's newest tier
        ],
        2: [
            _click("s-x", None, T0 + 10 * MIN),  # anonymous
            _click("s-z", "cus-z", T0 + 12 * MIN),  # never registered
            _click("s-b2", "cus-b", T0 + 50 * MIN),  # b's newest tier
        ],
        3: [_click("s-y", "cus-a", T0 + 65 * MIN)],  # past the table's watermark: waits
    }


def _records(topic: str, log: dict[int, list[tuple[str, dict]]], key: str) -> list[SourceRecord]:
    return [
        SourceRecord(topic, p, offset, event[key].encode(), CODEC.encode(event_type, event))
        for p, events in sorted(log.items())
        for offset, (event_type, event) in enumerate(events)
    ]


def _decoded(records):
    for r in records:
        event = CODEC.decode(r.value)
        yield r.topic, r.partition, r.offset, event.event_type, event.data


def _chunks(records, rng, most=4):
    """Records in random chunks, each partition's in log order, partitions interleaved."""
    queues = {}
    for r in records:
        queues.setdefault(r.partition, []).append(r)
    while queues:
        chunk = []
        for _ in range(rng.randint(1, most)):
            if not queues:
                break
            p = rng.choice(sorted(queues))
            chunk.append(queues[p].pop(0))
            if not queues[p]:
                del queues[p]
        yield chunk


class _Run:
    """One generation of the table and of the lookup processor, under one key prefix."""

    def __init__(self, target, redis_url, generation, table_is_live_at_start=True):
        self.client = redis_client(redis_url)
        prefix = target.key_prefix
        self.table_target = dataclasses.replace(
            target,
            processor="customer_profiles",
            generation=generation,
            event_time=CUSTOMER_PROFILES.event_time,
            topics=("crm",),
        )
        tables = GenerationRegistry.of(self.client, "customer_profiles", prefix)
        starts = {position_field("crm", p): 0 for p in range(PARTITIONS)}
        tables.set_positions(tables.create({"topics": ["crm"]}), starts)
        if table_is_live_at_start:
            self.client.set(StateLayout("customer_profiles", prefix).alias, generation)
        self.table = FoldWriter(self.table_target, CustomerProfilesProjection(RETENTION))
        self.layout = StateLayout("enriched_clicks", prefix)
        GenerationRegistry(self.client, self.layout).create({"topics": ["se"]}, live=True)
        clicks_target = dataclasses.replace(
            target,
            processor="enriched_clicks",
            generation=generation,
            event_time=ENRICHED_CLICKS.event_time,
            topics=("se",),
        )
        self.clicks = FoldWriter(clicks_target, EnrichedClicksProjection())
        self.joiner = LookupJoiner(
            self.layout,
            generation,
            EnrichedClicksProjection(),
            ENRICHED_CLICKS.event_time,
            CUSTOMER_PROFILES.event_time.lateness_ms,
            redis_url,
            {"bootstrap.servers": "unused:1"},
            target.dlq_topic,
        )
        self.generation = generation
        self.prefix = prefix

    def result(self):
        assert self.joiner.run() == 0  # a repeated round joins nothing more
        reader = StateReader(self.client, "enriched_clicks", self.prefix)
        totals = reader.aggregate("clicks_by_customer", self.generation).value
        waiting = self.client.zcard(self.layout.generation(self.generation).timers("lookup"))
        table = StateReader(self.client, "customer_profiles", self.prefix)
        rows = dict(table.scan("profiles", self.generation))
        return totals, waiting, rows


def test_clicks_see_the_tier_of_their_time_with_a_late_change_and_bounded_versions(
    target, redis_url
):
    crm = _records("crm", _table_log(), "customer_id")
    clicks = _records("se", _click_log(), "session_id")

    # Live: every click is in before the table has its changes (so the late one reaches the
    # table after the clicks it decides); the joiner runs after every chunk of either.
    live = _Run(target, redis_url, 1)
    for chunk in _chunks(clicks, random.Random(2), most=2):
        live.clicks.apply(chunk)
        assert live.joiner.run() == 0  # the table has no watermark yet
    joined = []
    for chunk in _chunks(crm, random.Random(1)):
        live.table.apply(chunk)
        joined.append(live.joiner.run())
    first = live.result()
    assert sum(joined) == 8
    assert len([n for n in joined if n]) > 1  # joined in steps, as the table's watermark moved

    # Replay: both rebuilt in generation 2, the table complete first, other batch sizes.
    replay = _Run(target, redis_url, 2, table_is_live_at_start=False)
    for chunk in _chunks(crm, random.Random(3), most=9):
        replay.table.apply(chunk)
    replay.client.set(StateLayout("customer_profiles", replay.prefix).alias, 2)
    for chunk in _chunks(clicks, random.Random(4), most=5):
        replay.clicks.apply(chunk)
    replay.joiner.run()
    second = replay.result()

    # The oracle: the table folded the plain way (same retention), then the join.
    profiles = fold_timed(
        CustomerProfilesProjection(RETENTION),
        CUSTOMER_PROFILES.event_time,
        ("crm",),
        _decoded(crm),
    )
    clocks = {}
    for _topic, partition, _offset, event_type, event in _decoded(crm):
        at = event[CUSTOMER_PROFILES.event_time.field_of(event_type)]
        field = position_field("crm", partition)
        clocks[field] = max(clocks.get(field, at), at)
    table_watermark = watermark_of(clocks, CUSTOMER_PROFILES.event_time.lateness_ms)
    expected = fold_lookups(
        EnrichedClicksProjection(),
        ENRICHED_CLICKS.event_time,
        _decoded(clicks),
        profiles.states,
        table_watermark,
    )

    assert first == second
    totals, waiting, rows = first
    assert totals == dict(expected.aggregate)
    assert waiting == expected.waiting == 1
    assert rows == profiles.states
    # What that means, click by click: a's clicks at 5, 15, 22 and 27 min under the tier of
    # their time (the late PLATINUM counts, the refused STANDARD never does), b's under its
    # newest; a join on each customer's latest profile would have put all of a's under
    # PLATINUM.
    assert totals == {
        "clicks": 8,
        "anonymous": 1,
        "unregistered": 1,
        "tier:SILVER": 1,
        "tier:GOLD": 1 + 2,
        "tier:PLATINUM": 2,
        "country:NL": 4 + 2,
    }
    a = rows["cus-a"]
    assert [v["tier"] for _, v in a["versions"]] == ["SILVER", "GOLD", "PLATINUM"]
    assert "dropped" not in a
    b = rows["cus-b"]  # 8 versions made, 3 kept, in the table's transaction
    assert [v["tier"] for _, v in b["versions"]] == ["PLATINUM", "GOLD", "GOLD"]
    assert b["dropped"] == 5
    assert as_of(b, T0 + 5 * MIN) == b["versions"][0][1]
    assert as_of(b, T0 + 4 * MIN) is EXPIRED
    profile_totals = StateReader(live.client, "customer_profiles", live.prefix).aggregate(
        "profile_totals", 1
    )
    kept = sum(len(r["versions"]) for r in rows.values())
    dropped = 5 + 1 + 1  # b's, and one each of d's and e's four versions
    assert Counter(profile_totals.value) == Counter(
        {"customers": 6, "versions": kept, "dropped_versions": dropped}
    )
