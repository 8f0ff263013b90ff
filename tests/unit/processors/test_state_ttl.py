"""State that expires (``state_ttl``), the pure rule: on event time, whatever the interleaving."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.errors import ContractError
from refold.contracts.processors import EventTime, ProcessorSpec, StateTtl
from refold.processors.fold.expiry import Expiries, firing_order
from refold.processors.fold.oracle import fold_timed

TTL = StateTtl(after_ms=1_000)


class Visits:
    """Counts each user's visits; the aggregate counts users and visits."""

    name = "visits"
    table = "visitors"
    aggregate = "visit_totals"
    event_types = ("Visited",)

    def key(self, event_type, event):
        return event["user"]

    def apply(self, state, event_type, event):
        before = state or {"visits": 0, "last": event["at"]}
        return {"visits": before["visits"] + 1, "last": max(before["last"], event["at"])}

    def contribution(self, state):
        return {"users": 1, "visits": state["visits"]}


def _visit(topic: str, offset: int, user: str, at: int, partition: int = 0):
    return topic, partition, offset, "Visited", {"user": user, "at": at}


def _fold(records, lateness_ms=0, topics=("web",), ttl=TTL):
    event_time = EventTime(field="at", lateness_ms=lateness_ms)
    return fold_timed(Visits(), event_time, topics, records, state_ttl=ttl)


def test_state_ttl_is_checked_and_needs_an_event_time():
    with pytest.raises(ContractError, match="after_ms >= 1"):
        StateTtl(after_ms=0)
    with pytest.raises(ContractError, match="int of milliseconds"):
        StateTtl(after_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="declare event_time"):
        ProcessorSpec("p", "m:f", ("t",), "k", ("t",), state_ttl=TTL)
    spec = ProcessorSpec(
        "p", "m:f", ("t",), "k", ("t",), event_time=EventTime(field="at"), state_ttl=TTL
    )
    assert spec.state_ttl == TTL


def test_expiries_keep_the_largest_event_time_plus_the_ttl():
    expiries = Expiries(TTL)
    expiries.applied(0, "a", 5_000)
    expiries.applied(0, "a", 4_000)  # a late event never moves the expiry back
    assert expiries.queue.due_of(0, "a") == 6_000
    assert not expiries.stale(0, "a", 5_999)
    assert expiries.stale(0, "a", 6_000)
    assert expiries.pop_due(0, 5_999) == []
    assert expiries.pop_due(0, 6_000) == [(6_000, "a")]
    expiries.applied(0, "b", 0)
    expiries.forget(0, "b")
    assert expiries.queue.changed[(0, "b")] is None
    # An entity's own timer goes before its expiry at the same due time.
    assert firing_order([(5, "x"), (9, "y")], [(5, "x"), (2, "z")]) == [
        (2, True, "z"),
        (5, False, "x"),
        (5, True, "x"),
        (9, False, "y"),
    ]


def test_an_entity_with_no_event_for_the_ttl_leaves_the_table_and_the_aggregate():
    log = [
        _visit("web", 0, "ann", 0),
        _visit("web", 1, "ann", 500),
        _visit("web", 2, "bob", 900),
        _visit("web", 3, "bob", 1_600),  # watermark 1_600 >= ann's expiry (1_500): ann goes
    ]
    result = _fold(log)
    assert result.states == {"bob": {"visits": 2, "last": 1_600}}
    assert dict(result.aggregate) == {"users": 1, "visits": 2}
    assert result.expired == 1
    # Without the TTL nothing goes (the test fails before the change).
    assert set(_fold(log, ttl=None).states) == {"ann", "bob"}


def test_an_event_past_the_expiry_starts_the_entity_anew_before_the_watermark_gets_there():
    # A lateness of 10 s holds the watermark back: only ann's own next event shows the gap.
    log = [_visit("web", 0, "ann", 0), _visit("web", 1, "ann", 1_000)]
    result = _fold(log, lateness_ms=10_000)
    assert result.states == {"ann": {"visits": 1, "last": 1_000}}
    assert result.expired == 1
    assert dict(result.aggregate) == {"users": 1, "visits": 1}
    kept = _fold([_visit("web", 0, "ann", 0), _visit("web", 1, "ann", 999)], lateness_ms=10_000)
    assert kept.states == {"ann": {"visits": 2, "last": 999}}
    assert kept.expired == 0


def _interleave(logs: list[list[tuple]], rng: random.Random) -> list[tuple]:
    """The logs merged in a random order, each kept in its own order."""
    left = [list(log) for log in logs]
    out = []
    while any(left):
        pick = rng.choice([log for log in left if log])
        out.append(pick.pop(0))
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 400)), min_size=1, max_size=40),
    st.lists(st.tuples(st.sampled_from("cd"), st.integers(0, 400)), min_size=1, max_size=40),
    st.integers(0, 2**32),
)
def test_what_expires_does_not_depend_on_how_the_topics_interleave(clicks, views, seed):
    """Two co-partitioned topics: the group's watermark moves with the interleaving, and the
    expiries fire at other records, but what expires, and the states, are the same."""

    def log(topic: str, steps: list[tuple[str, int]]) -> list[tuple]:
        at, out = 0, []
        for offset, (user, step) in enumerate(steps):
            at += step  # in order on its partition (nothing late)
            out.append(_visit(topic, offset, user, at))
        return out

    logs = [log("clicks", clicks), log("views", views)]
    rng = random.Random(seed)
    runs = [
        _fold(_interleave(logs, rng), lateness_ms=300, topics=("clicks", "views")) for _ in range(3)
    ]
    first = runs[0]
    for other in runs[1:]:
        assert other.states == first.states
        assert other.aggregate == first.aggregate
        assert other.expired == first.expired


def test_the_worked_example_of_the_docs():
    """docs/event-time.md, "Expiring state": lateness 2 min, TTL 10 min, one partition."""
    minute = 60_000
    log = [
        _visit("web", i, user, at * minute)
        for i, (user, at) in enumerate([("s1", 0), ("s2", 5), ("s1", 8), ("s2", 13), ("s3", 21)])
    ]
    ttl = StateTtl(after_ms=10 * minute)
    after_s3 = _fold(log, lateness_ms=2 * minute, ttl=ttl)
    assert set(after_s3.states) == {"s2", "s3"}
    assert after_s3.expired == 1
    assert dict(after_s3.aggregate) == {"users": 2, "visits": 3}
    last = _fold([*log, _visit("web", 5, "s2", 24 * minute)], lateness_ms=2 * minute, ttl=ttl)
    assert last.expired == 2
    assert last.states["s2"] == {"visits": 1, "last": 24 * minute}
