"""Complex event processing (processors/fold/patterns.py): each pattern's semantics and
boundaries, insights in their contract, bounded state, and the property that makes it exact:
the insights, states and aggregates do not depend on the arrival order within the lateness, on
how topics interleave, or on how many timer firings the settling took (through fold_timed, the
oracle the envelope is tested against)."""

from __future__ import annotations

import datetime as dt
import pickle
import random
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.processors import EventTime, ProcessorOptions
from refold.processors.customer_alerts.projection import build as build_customer_alerts
from refold.processors.fold.matching import (
    above,
    at_least,
    at_most,
    below,
    between,
    not_equal,
    one_of,
)
from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.patterns import (
    Absence,
    CountWithin,
    On,
    PatternConfigError,
    PatternProjection,
    Sequence,
)
from refold.processors.fold.timers import TIMER_EVENT, timer_event
from refold.processors.order_alerts.projection import build as build_order_alerts

LATENESS = 20
TIME = EventTime(field="at", lateness_ms=LATENESS)
TYPES = ("A", "B", "C", "N")  # N: named by no pattern


def fold(*patterns, topics=("t",)):
    return PatternProjection(
        "cep", key="k", event_types=TYPES, event_time=TIME, patterns=patterns
    ), topics


def ev(t, event_type="A", key="k1", event_id=None, **fields):
    event = {"k": key, "at": t, **fields}
    if event_id is not None:
        event["event_id"] = event_id
    return event_type, event


def run(projection, events, topics=("t",), partition=0):
    """Fold ``events`` (in this log order) on one partition of the first topic."""
    records = [
        (topics[0], partition, offset, event_type, event)
        for offset, (event_type, event) in enumerate(events)
    ]
    return fold_timed(projection, TIME, topics, records)


def insights(result):
    return sorted((e.value for e in result.effects), key=lambda i: i["insight_id"])


def brief(result):
    """(pattern, first_at, detected_at, events) per insight."""
    return [(i["pattern"], i["first_at"], i["detected_at"], i["events"]) for i in insights(result)]


FAR = ev(10_000, "N", key="zz")  # moves the watermark past everything before it


# --- declarations ----------------------------------------------------------------------------


def test_on_matches_the_type_and_every_equality_as_json_scalars():
    cancelled = On("OrderStatusChanged", status="cancelled")
    assert cancelled.matches("OrderStatusChanged", {"status": "cancelled"})
    assert not cancelled.matches("OrderStatusChanged", {"status": "paid"})
    assert not cancelled.matches("OrderCancelled", {"status": "cancelled"})
    assert On("X").matches("X", {})
    # A field named like a parameter, and a time given as a datetime (compared in ms).
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    on = On("X", where={"where": 1}, when=at)
    assert on.matches("X", {"where": 1, "when": 1_767_225_600_000})
    assert on.label == "X[when=1767225600000,where=1]"
    assert pickle.loads(pickle.dumps(on)) == on  # noqa: S301 - our own bytes (Spark ships it)


def above_its_limit(event):
    """A pure test on the whole event: a reading above its own limit."""
    return event["celsius"] > event["limit"]


def test_on_takes_comparisons_and_a_pure_test():
    hot = On("Reading", celsius=above(80))
    assert hot.matches("Reading", {"celsius": 80.5})
    assert not hot.matches("Reading", {"celsius": 80})
    assert not hot.matches("Reading", {"celsius": None})  # missing: never satisfied
    assert not hot.matches("Reading", {"celsius": "hot"})  # text vs number: not an error
    assert hot.label == "Reading[celsius>80]"
    assert On("R", c=at_least(1)).matches("R", {"c": 1})
    assert On("R", c=below(1)).matches("R", {"c": 0})
    assert not On("R", c=at_most(1)).matches("R", {"c": 2})
    assert On("R", c=between(1, 3)).matches("R", {"c": 3})
    assert On("R", c=one_of("a", "b")).matches("R", {"c": "b"})
    assert not On("R", c=not_equal("a")).matches("R", {"c": "a"})
    tested = On("Reading", test=above_its_limit)
    assert tested.label == "Reading[test=above_its_limit]"
    assert tested.judge({"celsius": 5, "limit": 4})
    assert tested.matches("Reading", {tested.test_key: True})
    assert not tested.matches("Reading", {tested.test_key: False})
    assert pickle.loads(pickle.dumps(hot)) == hot  # noqa: S301 - our own bytes (Spark ships it)
    assert pickle.loads(pickle.dumps(tested)) == tested  # noqa: S301 - likewise


def test_three_readings_above_80_within_5_minutes_is_one_insight():
    threshold = CountWithin("overheat", On("A", celsius=above(80)), count=3, within_ms=300)
    projection, _topics = fold(threshold)
    readings = [
        ev(t, celsius=c, event_id=f"r{t}")
        for t, c in [(0, 81), (50, 79), (100, 90), (150, 85), (400, 99), (1_000, 95)]
    ]
    result = run(projection, [*readings, FAR])
    # 79 does not count; 99 and 95 are too far apart for a second match.
    assert brief(result) == [("overheat", 0, 150, ["r0", "r100", "r150"])]


def test_a_pure_test_decides_with_the_whole_event_and_is_kept_with_it():
    over = CountWithin("over_limit", On("A", test=above_its_limit), count=2, within_ms=300)
    projection, _topics = fold(over)
    readings = [
        ev(0, celsius=50, limit=40, event_id="a"),
        ev(10, celsius=50, limit=60, event_id="b"),
        ev(20, celsius=70, limit=60, event_id="c"),
    ]
    forward = run(projection, [*readings, FAR])
    backward = run(projection, [*readings[::-1], FAR])  # arrival order within the lateness
    assert brief(forward) == brief(backward) == [("over_limit", 0, 20, ["a", "c"])]


@pytest.mark.parametrize(
    "declare",
    [
        lambda: Sequence("one_step", steps=(On("A"),), within_ms=5),
        lambda: Sequence("Bad-Name", steps=(On("A"), On("B")), within_ms=5),
        lambda: Sequence("negative", steps=(On("A"), On("B")), within_ms=-1),
        lambda: CountWithin("zero", on=On("A"), count=0, within_ms=5),
        lambda: Absence("nothing_expected", after=On("A"), expect=(), within_ms=5),
        lambda: fold(),
        lambda: fold(CountWithin("x", On("A"), 2, 5), CountWithin("x", On("B"), 2, 5)),
        lambda: fold(CountWithin("unknown", On("Z"), 2, 5)),
        lambda: PatternProjection("cep", key="k", event_types=TYPES, event_time=None, patterns=[]),
    ],
)
def test_wrong_declarations_are_refused_when_the_fold_is_built(declare):
    with pytest.raises(PatternConfigError) as caught:
        declare()
    assert isinstance(caught.value, RefoldError)


def test_the_reference_processors_are_picklable_and_name_their_insights_topic():
    order_alerts = build_order_alerts(ProcessorOptions())
    copy = pickle.loads(pickle.dumps(order_alerts))  # noqa: S301 - our own bytes
    assert copy.patterns == order_alerts.patterns
    assert order_alerts.effect_topics == ("order_alerts.insights",)
    customer_alerts = build_customer_alerts(ProcessorOptions())
    assert customer_alerts.effect_topics == ("customer_alerts.insights",)


# --- sequence --------------------------------------------------------------------------------


def test_a_sequence_completes_exactly_at_its_window_and_not_one_ms_later():
    projection, _ = fold(Sequence("ab", steps=(On("A"), On("B")), within_ms=100))
    on_the_edge = run(projection, [ev(0, "A", event_id="a"), ev(100, "B", event_id="b"), FAR])
    assert brief(on_the_edge) == [("ab", 0, 100, ["a", "b"])]
    beyond = run(projection, [ev(0, "A", event_id="a"), ev(101, "B", event_id="b"), FAR])
    assert brief(beyond) == []


def test_a_sequence_skips_events_between_its_steps_and_uses_each_event_once():
    projection, _ = fold(Sequence("abc", steps=(On("A"), On("B"), On("C")), within_ms=100))
    result = run(
        projection,
        [
            ev(0, "A", event_id="a1"),
            ev(1, "C", event_id="c0"),  # not the next step: skipped
            ev(2, "A", event_id="a2"),  # a second partial
            ev(3, "B", event_id="b1"),  # the oldest partial takes it
            ev(4, "B", event_id="b2"),  # then the second
            ev(5, "C", event_id="c1"),  # completes the first only
            ev(6, "C", event_id="c2"),  # completes the second
            ev(7, "C", event_id="c3"),  # nothing waits for it
            FAR,
        ],
    )
    assert brief(result) == [
        ("abc", 0, 5, ["a1", "b1", "c1"]),
        ("abc", 2, 6, ["a2", "b2", "c2"]),
    ]


def test_a_sequence_of_one_event_type_pairs_its_events_without_overlap():
    projection, _ = fold(Sequence("aa", steps=(On("A"), On("A")), within_ms=10))
    result = run(projection, [ev(t, "A", event_id=f"a{t}") for t in (0, 1, 2, 3, 4)] + [FAR])
    assert [i[3] for i in brief(result)] == [["a0", "a1"], ["a2", "a3"]]


def test_an_expired_partial_is_dropped_from_the_state_once_the_watermark_passes_its_window():
    projection, _ = fold(Sequence("ab", steps=(On("A"), On("B")), within_ms=100))
    open_ = run(projection, [ev(0, "A", event_id="a"), ev(100 + LATENESS, "N", key="zz")])
    assert open_.states["k1"]["open"] == {"ab": [[0, 1, ["a"]]]}
    expired = run(projection, [ev(0, "A", event_id="a"), ev(101 + LATENESS, "N", key="zz")])
    assert "k1" not in expired.states  # nothing open, no insight: the key is gone


def test_open_partials_per_key_are_bounded():
    projection, _ = fold(Sequence("ab", steps=(On("A"), On("B")), within_ms=1_000, max_open=3))
    result = run(projection, [ev(t, "A", event_id=f"a{t}") for t in range(10)] + [ev(50, "N")])
    assert [p[0] for p in result.states["k1"]["open"]["ab"]] == [7, 8, 9]


# --- count -----------------------------------------------------------------------------------


def test_a_count_fires_when_its_events_fit_the_window_exactly_and_not_one_ms_wider():
    projection, _ = fold(CountWithin("three_a", On("A"), count=3, within_ms=60))
    fits = run(projection, [ev(0, event_id="1"), ev(30, event_id="2"), ev(60, event_id="3"), FAR])
    assert brief(fits) == [("three_a", 0, 60, ["1", "2", "3"])]
    wider = run(projection, [ev(0, event_id="1"), ev(30, event_id="2"), ev(61, event_id="3"), FAR])
    assert brief(wider) == []


def test_a_count_starts_over_after_a_match():
    projection, _ = fold(CountWithin("three_a", On("A"), count=3, within_ms=60))
    events = [ev(t, event_id=str(t)) for t in (0, 1, 2, 3, 4, 5, 6)]
    result = run(projection, [*events, FAR])
    # 0,1,2 match; the 4th (3) starts over: 3,4,5 match; 6 waits for two more.
    assert [i[3] for i in brief(result)] == [["0", "1", "2"], ["3", "4", "5"]]
    assert result.aggregate["insights:three_a"] == 2


def test_a_count_only_counts_events_matching_its_fields():
    projection, _ = fold(CountWithin("two_x", On("A", v="x"), count=2, within_ms=60))
    result = run(projection, [ev(0, v="x"), ev(1, v="y"), ev(2, v="y"), ev(3, v="x"), FAR])
    assert [i[3] for i in brief(result)] == [["A@0", "A@3"]]  # no event_id: <type>@<time>


# --- absence ---------------------------------------------------------------------------------


def test_an_absence_is_disarmed_by_an_expect_exactly_at_its_deadline():
    projection, _ = fold(Absence("a_not_b", after=On("A"), expect=On("B"), within_ms=100))
    at_deadline = run(projection, [ev(0, "A", event_id="a"), ev(100, "B"), FAR])
    assert brief(at_deadline) == []
    one_ms_late = run(projection, [ev(0, "A", event_id="a"), ev(101, "B"), FAR])
    assert brief(one_ms_late) == [("a_not_b", 0, 100, ["a"])]
    assert insights(one_ms_late)[0]["details"]["deadline"] == "100"


def test_an_absence_fires_only_once_the_watermark_is_above_its_deadline():
    projection, _ = fold(Absence("a_not_b", after=On("A"), expect=On("B"), within_ms=100))
    at = run(projection, [ev(0, "A"), ev(100 + LATENESS, "N", key="other")])  # watermark 100
    assert brief(at) == []
    assert at.states["k1"]["open"] == {"a_not_b": [[100, 0, "A@0"]]}
    above = run(projection, [ev(0, "A"), ev(101 + LATENESS, "N", key="other")])
    assert brief(above) == [("a_not_b", 0, 100, ["A@0"])]


@pytest.mark.parametrize("expect_type", ["B", "0"])  # sorts after, and before, the A
def test_an_expect_at_the_same_time_as_its_after_disarms_it_whichever_sorts_first(expect_type):
    projection = PatternProjection(
        "cep",
        key="k",
        event_types=(*TYPES, "0"),
        event_time=TIME,
        patterns=[Absence("a_not_b", after=On("A"), expect=On(expect_type), within_ms=100)],
    )
    result = run(projection, [ev(5, expect_type), ev(5, "A"), FAR])
    assert brief(result) == []


def test_an_expect_before_its_after_does_not_count_and_each_after_arms_a_deadline():
    projection, _ = fold(Absence("a_not_b", after=On("A"), expect=On("B"), within_ms=100))
    result = run(
        projection,
        [ev(0, "B"), ev(1, "A", event_id="a1"), ev(1, "A", event_id="a2"), ev(2, "C"), FAR],
    )
    found = insights(result)
    assert [i["events"] for i in found] == [["a1"], ["a2"]]
    # Two matches detected at one time: numbered 0 and 1.
    assert [i["insight_id"] for i in found] == ["cep/a_not_b/k1/101/0", "cep/a_not_b/k1/101/1"]


# --- insights, ties, duplicates, state -------------------------------------------------------


def test_insights_fit_their_contract_and_say_what_matched():
    projection, _ = fold(
        Sequence("ab", steps=(On("A"), On("B")), within_ms=100, description="A then B"),
        CountWithin("two_c", On("C"), count=2, within_ms=10, severity="warning"),
        Absence("a_not_b", after=On("A"), expect=(On("B"), On("C", v="x")), within_ms=5),
    )
    result = run(
        projection,
        [ev(0, "A", event_id="a"), ev(9, "C"), ev(10, "C"), ev(50, "B", event_id="b"), FAR],
    )
    codec = EventCodec()
    found = insights(result)
    for insight in found:
        assert codec.decode(codec.encode("Insight", insight)).data == insight
    assert {i["insight_id"]: (i["kind"], i["severity"], i["details"]) for i in found} == {
        "cep/ab/k1/50/0": (
            "sequence",
            "critical",
            {"steps": "A -> B", "within_ms": "100", "description": "A then B"},
        ),
        "cep/two_c/k1/10/0": ("count", "warning", {"on": "C", "count": "2", "within_ms": "10"}),
        "cep/a_not_b/k1/5/0": (
            "absence",
            "critical",
            {"after": "A", "expect": "B | C[v=x]", "within_ms": "5", "deadline": "5"},
        ),
    }
    assert {e.topic for e in result.effects} == {"cep.insights"}
    assert {e.contract for e in result.effects} == {"Insight"}
    assert result.aggregate == {
        "insights": 3,
        "insights:ab": 1,
        "insights:two_c": 1,
        "insights:a_not_b": 1,
    }


def test_ties_are_settled_in_one_order_whatever_the_arrival():
    projection, _ = fold(Sequence("ab", steps=(On("A"), On("B")), within_ms=10))
    tied = [ev(3, "A", event_id="a2"), ev(3, "A", event_id="a1"), ev(3, "B", v=1), ev(3, "B")]
    forward = run(projection, [*tied, FAR])
    backward = run(projection, [*reversed(tied), FAR])
    assert insights(forward) == insights(backward)
    assert [i["events"][0] for i in insights(forward)] == ["a1", "a2"]


def test_a_repeated_event_counts_once():
    projection, _ = fold(CountWithin("two_c", On("C"), count=2, within_ms=10))
    # An upstream's at-least-once output: the same record twice, with or without an event id.
    twice = [ev(1, "C"), ev(1, "C"), ev(2, "C", event_id="x"), ev(2, "C", event_id="x")]
    result = run(projection, [*twice, FAR])
    assert brief(result) == [("two_c", 1, 2, ["C@1", "x"])]


def test_keys_without_anything_open_or_found_are_deleted():
    projection, _ = fold(CountWithin("two_c", On("C"), count=2, within_ms=10))
    result = run(projection, [ev(0, "N"), ev(1, "A"), ev(2, "C", key="k2"), ev(100, "N", key="k3")])
    assert set(result.states) == {"k3"}  # k3's newest event is not below the watermark yet
    assert result.aggregate == {}


def test_effects_are_the_insights_of_the_firing_only():
    projection, _ = fold(CountWithin("two_c", On("C"), count=2, within_ms=10))
    state = None
    for _type, event in (ev(0, "C"), ev(1, "C"), ev(30, "C")):
        state = projection.apply(state, _type, event)
    fired = projection.on_timer(state, 5)
    assert [i["events"] for i in _values(projection, state, fired, 5)] == [["C@0", "C@1"]]
    assert _values(projection, fired, projection.on_timer(fired, 31), 31) == []
    assert projection.effects("C", {}, state, fired) == []  # only timers emit


def test_events_at_the_watermark_wait_for_the_next_firing():
    """On-time records may still come at the watermark itself: only what is below settles."""
    projection, _ = fold(CountWithin("two_c", On("C"), count=2, within_ms=10))
    state = projection.apply(None, *ev(7, "C"))
    assert projection.due(state) == 8
    state = projection.on_timer(projection.apply(state, *ev(8, "C")), 8)
    assert [e[0] for e in state["buffer"]] == [8]
    assert state["open"] == {"two_c": [[7, "C@7"]]}
    assert projection.due(state) == 9


def _values(projection, before, after, watermark):
    return [e.value for e in projection.effects(TIMER_EVENT, timer_event(watermark), before, after)]


# --- the property: no dependence on arrival, interleaving or firings ---------------------------

PROPERTY_PATTERNS = (
    Sequence("ab", steps=(On("A", v="x"), On("B")), within_ms=40),
    CountWithin("three_c", On("C"), count=3, within_ms=30),
    Absence("a_not_c", after=On("A"), expect=On("C", v="x"), within_ms=25),
)
TWO_TOPICS = ("t1", "t2")

_events = st.lists(
    st.tuples(
        st.integers(0, 20).map(lambda n: n * 5),  # event time, coarse: ties and exact edges
        st.sampled_from(TYPES),
        st.sampled_from(("k1", "k2")),
        st.sampled_from(("x", "y")),
        st.booleans(),  # with an event id
        st.sampled_from(TWO_TOPICS),
    ),
    min_size=1,
    max_size=80,
)


def _log(rows, seed):
    """Each topic partition's records in an arrival order drawn by ``seed``: sorted by time plus
    a delay within the lateness (so no record is late), the topic partitions interleaved."""
    rng = random.Random(seed)
    logs: dict[tuple[str, int], list] = {}
    for n, (t, event_type, key, v, with_id, topic) in enumerate(rows):
        event = {"k": key, "at": t, "v": v}
        if with_id:
            event["event_id"] = f"e{n}"
        partition = zlib.crc32(key.encode()) % 2
        arrival = t + rng.choice(range(0, LATENESS + 1, 5))
        logs.setdefault((topic, partition), []).append((arrival, n, event_type, event))
    queues = [
        [(topic, partition, offset, et, e) for offset, (_a, _n, et, e) in enumerate(sorted(log))]
        for (topic, partition), log in sorted(logs.items())
    ]
    out = []
    while queues:
        queue = rng.choice(queues)
        out.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return out


def _outcome(rows, seed, heartbeat):
    projection = PatternProjection(
        "cep", key="k", event_types=TYPES, event_time=TIME, patterns=PROPERTY_PATTERNS
    )
    records = _log(rows, seed)
    # Both topics, both partitions, far ahead: every group's watermark passes everything.
    records += [
        (t, p, 10_000, "N", {"k": f"h{p}", "at": heartbeat}) for t in TWO_TOPICS for p in (0, 1)
    ]
    result = fold_timed(projection, TIME, TWO_TOPICS, records)
    assert result.late == []
    assert result.rejected == []
    return insights(result), result.states, dict(result.aggregate)


@settings(max_examples=500, deadline=None)
@given(_events, st.integers(0, 2**32), st.integers(0, 2**32), st.sampled_from((200, 10_000)))
def test_insights_do_not_depend_on_arrival_order_interleaving_or_firings(rows, seed1, seed2, end):
    """Two topics (co-partitioned), records delayed within the lateness, interleaved two ways:
    the group watermarks move differently, so timers fire at other places and settle in other
    steps. With ``end`` 200 the last events stay unsettled: the open states must agree too."""
    assert _outcome(rows, seed1, end) == _outcome(rows, seed2, end)


def test_the_property_s_inputs_do_find_every_kind_of_match():
    rows = [
        (0, "A", "k1", "x", True, "t1"),
        (10, "B", "k1", "y", True, "t2"),
        (20, "C", "k2", "y", False, "t1"),
        (21, "C", "k2", "y", False, "t2"),
        (22, "C", "k2", "y", False, "t1"),
    ]
    found, _states, totals = _outcome(rows, 1, 10_000)
    assert {i["pattern"] for i in found} == {"ab", "three_c", "a_not_c"}
    assert totals["insights"] == 3
