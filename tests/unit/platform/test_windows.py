"""Windows: bucket arithmetic of each kind, what an event adds, combining, results and timers."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.errors import ContractError
from refold.processors.fold.windows import (
    Hopping,
    Measure,
    Sliding,
    Tumbling,
    WindowCells,
    WindowDelta,
    combine,
    decode_timer,
    encode_timer,
    result_of,
    windows_topic,
)
from refold.processors.runtime.window_results import _slide

PROPERTY = settings(max_examples=200, derandomize=True, database=None, deadline=None)
MINUTE = 60_000

TIMES = st.integers(min_value=-(10**13), max_value=10**13)


@st.composite
def windows(draw):
    """Any window kind with a small multiple of its hop or step (1 ms upward: odd sizes too)."""
    every = draw(st.integers(min_value=1, max_value=90_000))
    times = draw(st.integers(min_value=1, max_value=8))
    kind = draw(st.sampled_from(["tumbling", "hopping", "sliding"]))
    if kind == "tumbling":
        return Tumbling("w", size_ms=every * times)
    if kind == "hopping":
        return Hopping("w", size_ms=every * times, hop_ms=every)
    return Sliding("w", size_ms=every * times, step_ms=every)


# --- bucket arithmetic --------------------------------------------------------------------------


def test_tumbling():
    w = Tumbling("per_minute", size_ms=MINUTE)
    assert w.bucket_ms == MINUTE
    assert w.starts(0) == [0]
    assert w.starts(59_999) == [0]
    assert w.starts(60_000) == [60_000]
    assert w.starts(-1) == [-60_000]  # floor, not towards zero
    assert w.starts(-60_000) == [-60_000]
    assert w.starts(-60_001) == [-120_000]
    assert w.ends(0) == [60_000]
    assert w.ends(-60_000) == [0]
    assert w.bucket_starts(60_000) == [0]
    assert w.bucket_starts(0) == [-60_000]


def test_hopping():
    w = Hopping("five_minutes", size_ms=5 * MINUTE, hop_ms=MINUTE)
    assert w.bucket_ms == 5 * MINUTE
    assert w.starts(0) == [0, -60_000, -120_000, -180_000, -240_000]  # newest first
    assert w.starts(61_000) == [60_000, 0, -60_000, -120_000, -180_000]
    assert w.starts(-1) == [-60_000, -120_000, -180_000, -240_000, -300_000]
    assert w.ends(60_000) == [360_000]
    assert w.ends(-300_000) == [0]
    assert w.bucket_starts(360_000) == [60_000]
    assert w.bucket_starts(0) == [-300_000]


def test_hopping_by_its_size_is_tumbling():
    hopping, tumbling = Hopping("h", size_ms=MINUTE, hop_ms=MINUTE), Tumbling("t", size_ms=MINUTE)
    for at in (-60_001, -1, 0, 1, 59_999, 60_000):
        assert hopping.starts(at) == tumbling.starts(at)


def test_sliding():
    w = Sliding("sliding", size_ms=30_000, step_ms=10_000)
    assert w.bucket_ms == 10_000
    assert w.starts(0) == [0]
    assert w.starts(19_999) == [10_000]
    assert w.starts(-1) == [-10_000]
    assert w.ends(0) == [10_000, 20_000, 30_000]  # ascending: the last is the latest
    assert w.ends(-10_000) == [0, 10_000, 20_000]
    assert w.bucket_starts(30_000) == [0, 10_000, 20_000]  # oldest first
    assert w.bucket_starts(0) == [-30_000, -20_000, -10_000]
    assert w.bucket_starts(10_000) == [-20_000, -10_000, 0]


def _every(w) -> int:
    """How often a window ends: its size, hop or step."""
    return getattr(w, "hop_ms", None) or getattr(w, "step_ms", None) or w.size_ms


@given(w=windows(), at=TIMES)
@PROPERTY
def test_an_event_is_in_exactly_the_windows_that_contain_it(w, at):
    """Buckets -> window ends -> buckets agree, and every window containing the event is found."""
    every = _every(w)
    starts = w.starts(at)
    assert len(starts) == len(set(starts)) == (w.size_ms // every if isinstance(w, Hopping) else 1)
    ends: set[int] = set()
    for start in starts:
        assert start % every == 0
        assert start <= at < start + w.bucket_ms
        for end in w.ends(start):
            assert end - w.size_ms <= at < end  # the window ending at `end` contains the event
            assert start in w.bucket_starts(end)
            ends.add(end)
    # Windows end on the grid of `every`; those containing `at` end in (at, at + size].
    assert ends == {e for e in range(at + 1, at + w.size_ms + 1) if e % every == 0}
    assert len(ends) == w.size_ms // every


@given(w=windows(), end=TIMES)
@PROPERTY
def test_a_window_s_buckets_cover_it_without_overlap(w, end):
    starts = w.bucket_starts(end)
    assert starts == sorted(starts)
    assert starts[0] == end - w.size_ms
    assert starts[-1] + w.bucket_ms == end
    assert all(b - a == w.bucket_ms for a, b in itertools.pairwise(starts))


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Hopping("h", size_ms=300_000, hop_ms=70_000), "multiple of hop_ms"),
        (lambda: Sliding("s", size_ms=300_000, step_ms=7_000), "multiple of step_ms"),
        (lambda: Hopping("h", size_ms=60_000, hop_ms=120_000), "multiple of hop_ms"),
        (lambda: Tumbling("t", size_ms=0), "sizes must be positive"),
        (lambda: Tumbling("t", size_ms=-60_000), "sizes must be positive"),
        (lambda: Hopping("h", size_ms=60_000, hop_ms=0), "sizes must be positive"),
        (lambda: Sliding("s", size_ms=60_000, step_ms=-1), "sizes must be positive"),
        (lambda: Sliding("s", size_ms=0, step_ms=0), "sizes must be positive"),
    ],
)
def test_sizes_are_checked(make, message):
    with pytest.raises(ContractError, match=message):
        make()


@pytest.mark.parametrize(
    "name",
    ["", "Per_minute", "1minute", "_minute", "per-minute", "per minute", "per:minute", "é", "a.b"],
)
@pytest.mark.parametrize(
    "make",
    [
        lambda n: Tumbling(n, size_ms=MINUTE),
        lambda n: Hopping(n, size_ms=MINUTE, hop_ms=MINUTE),
        lambda n: Sliding(n, size_ms=MINUTE, step_ms=MINUTE),
    ],
)
def test_names_are_checked(make, name):
    with pytest.raises(ContractError, match="lower case letters, digits and _"):
        make(name)


def test_a_name_with_a_trailing_newline_is_refused():
    with pytest.raises(ContractError):
        Tumbling("per_minute\n", size_ms=MINUTE)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ContractError, match=r"'Bad'.*lower case.*multiple of hop_ms"):
        Hopping("Bad", size_ms=100, hop_ms=30)


def test_good_names_and_sizes_pass():
    assert Tumbling("per_minute", size_ms=MINUTE).name == "per_minute"
    assert Hopping("h5m1", size_ms=300_000, hop_ms=60_000).size_ms == 300_000
    assert Sliding("s", size_ms=1, step_ms=1).step_ms == 1


def test_windows_topic():
    assert windows_topic("sales_windows") == "sales_windows.windows"


# --- WindowDelta.add ----------------------------------------------------------------------------


def _amount(group: str, amount: int, method: str = "CARD") -> Measure:
    return Measure(group=group, values={"amount": amount}, distinct={"methods": method})


def test_a_tumbling_bucket_counts_sums_extremes_and_distinct_values():
    w = Tumbling("per_minute", size_ms=MINUTE)
    delta = WindowDelta()
    assert not delta.adds
    delta.add([w], 1_000, _amount("EUR", 500, "CARD"), retention_ms=3_600_000)
    delta.add([w], 59_999, _amount("EUR", 200, "WALLET"), retention_ms=3_600_000)
    delta.add([w], 30_000, _amount("EUR", 900, "CARD"), retention_ms=3_600_000)
    delta.add([w], 60_000, _amount("EUR", 7, "CARD"), retention_ms=3_600_000)  # next minute
    delta.add([w], 2_000, _amount("USD", -50, "CARD"), retention_ms=3_600_000)  # a refund
    assert delta.adds == {
        ("per_minute", 0, "EUR"): Counter({"count": 3, "sum:amount": 1_600}),
        ("per_minute", 60_000, "EUR"): Counter({"count": 1, "sum:amount": 7}),
        ("per_minute", 0, "USD"): Counter({"count": 1, "sum:amount": -50}),
    }
    assert delta.lows == {
        ("per_minute", 0, "EUR", "min:amount"): 200,
        ("per_minute", 60_000, "EUR", "min:amount"): 7,
        ("per_minute", 0, "USD", "min:amount"): -50,
    }
    assert delta.highs == {
        ("per_minute", 0, "EUR", "max:amount"): 900,
        ("per_minute", 60_000, "EUR", "max:amount"): 7,
        ("per_minute", 0, "USD", "max:amount"): -50,
    }
    assert delta.distinct == {
        ("per_minute", "methods", 0, "EUR"): {"CARD", "WALLET"},
        ("per_minute", "methods", 60_000, "EUR"): {"CARD"},
        ("per_minute", "methods", 0, "USD"): {"CARD"},
    }
    assert delta.closes == {
        encode_timer("per_minute", 60_000, "EUR"): 60_000,
        encode_timer("per_minute", 120_000, "EUR"): 120_000,
        encode_timer("per_minute", 60_000, "USD"): 60_000,
    }
    assert delta.expiries == {
        encode_timer("per_minute", 0, "EUR"): 60_000 + 3_600_000,
        encode_timer("per_minute", 60_000, "EUR"): 120_000 + 3_600_000,
        encode_timer("per_minute", 0, "USD"): 60_000 + 3_600_000,
    }


def test_a_measure_without_values_only_counts():
    delta = WindowDelta()
    delta.add([Tumbling("t", size_ms=10)], 3, Measure(group="g"), retention_ms=0)
    assert delta.adds == {("t", 0, "g"): Counter({"count": 1})}
    assert (delta.lows, delta.highs, delta.distinct) == ({}, {}, {})
    assert delta.expiries == {encode_timer("t", 0, "g"): 10}  # zero retention: at the end


def test_several_values_are_each_summed_and_bounded():
    delta = WindowDelta()
    t = Tumbling("t", size_ms=10)
    delta.add([t], 1, Measure(group="g", values={"a": 1, "b": 10}), retention_ms=0)
    delta.add([t], 2, Measure(group="g", values={"a": 3}), retention_ms=0)
    assert delta.adds == {("t", 0, "g"): Counter({"count": 2, "sum:a": 4, "sum:b": 10})}
    assert delta.lows == {("t", 0, "g", "min:a"): 1, ("t", 0, "g", "min:b"): 10}
    assert delta.highs == {("t", 0, "g", "max:a"): 3, ("t", 0, "g", "max:b"): 10}


def test_a_hopping_event_adds_to_every_window_containing_it_each_with_its_timers():
    w = Hopping("h", size_ms=3 * MINUTE, hop_ms=MINUTE)
    delta = WindowDelta()
    delta.add([w], 61_000, _amount("EUR", 5), retention_ms=1_000)
    starts = [60_000, 0, -60_000]
    assert set(delta.adds) == {("h", s, "EUR") for s in starts}
    assert all(c == Counter({"count": 1, "sum:amount": 5}) for c in delta.adds.values())
    assert delta.closes == {encode_timer("h", s + 180_000, "EUR"): s + 180_000 for s in starts}
    assert delta.expiries == {encode_timer("h", s, "EUR"): s + 180_000 + 1_000 for s in starts}
    assert set(delta.distinct) == {("h", "methods", s, "EUR") for s in starts}


def test_a_sliding_event_adds_to_one_fine_bucket_closing_every_window_it_is_in():
    w = Sliding("s", size_ms=30_000, step_ms=10_000)
    delta = WindowDelta()
    delta.add([w], 15_000, _amount("EUR", 5), retention_ms=1_000)
    assert set(delta.adds) == {("s", 10_000, "EUR")}
    ends = [20_000, 30_000, 40_000]
    assert delta.closes == {encode_timer("s", e, "EUR"): e for e in ends}
    # the fine bucket is kept until the last window it is part of is past its retention
    assert delta.expiries == {encode_timer("s", 10_000, "EUR"): 40_000 + 1_000}


def test_one_event_adds_to_every_declared_window():
    declared = (
        Tumbling("per_minute", size_ms=MINUTE),
        Hopping("hopping", size_ms=2 * MINUTE, hop_ms=MINUTE),
        Sliding("sliding", size_ms=MINUTE, step_ms=30_000),
    )
    delta = WindowDelta()
    delta.add(declared, 90_000, _amount("EUR", 1), retention_ms=0)
    assert set(delta.adds) == {
        ("per_minute", 60_000, "EUR"),
        ("hopping", 60_000, "EUR"),
        ("hopping", 0, "EUR"),
        ("sliding", 90_000, "EUR"),
    }
    assert set(delta.closes.values()) == {120_000, 180_000, 150_000}


@st.composite
def _measured(draw):
    """An event: its time, group, values (any sign, some absent) and distinct values."""
    return draw(st.integers(min_value=-(10**7), max_value=10**7)), Measure(
        group=draw(st.sampled_from(["EUR", "USD"])),
        values=draw(st.dictionaries(st.sampled_from(["a", "b"]), st.integers(-(2**62), 2**62))),
        distinct=draw(st.dictionaries(st.sampled_from(["m"]), st.sampled_from(["x", "y", "z"]))),
    )


@PROPERTY
@given(st.lists(windows(), min_size=1, max_size=3), st.lists(_measured(), max_size=40))
def test_a_batch_aggregated_per_grid_cell_adds_what_its_events_add_one_by_one(declared, events):
    declared = [
        dataclasses.replace(w, name=f"w{i}", emit=i % 2 == 0) for i, w in enumerate(declared)
    ]
    one_by_one, cells = WindowDelta(), WindowCells(declared)
    for at, measure in events:
        one_by_one.add(declared, at, measure, retention_ms=7)
        cells.add(at, measure)
    assert cells.delta(retention_ms=7) == one_by_one


def test_timers_are_set_for_a_bucket_once_however_many_events_it_takes():
    w = Tumbling("t", size_ms=10)
    one, many = WindowDelta(), WindowDelta()
    one.add([w], 1, Measure("g"), retention_ms=5)
    for at in range(10):
        many.add([w], at, Measure("g"), retention_ms=5)
    assert (one.closes, one.expiries) == (many.closes, many.expiries)
    assert many.adds[("t", 0, "g")]["count"] == 10


# --- combine ------------------------------------------------------------------------------------


def test_combine_adds_counts_and_sums_and_bounds_extremes():
    buckets = [
        {"count": 2, "sum:amount": 700, "min:amount": 200, "max:amount": 500},
        {},
        {"count": 1, "sum:amount": -50, "min:amount": -50, "max:amount": -50},
        {"count": 3, "sum:amount": 30, "min:amount": 5, "max:amount": 20, "sum:other": 1},
    ]
    assert combine(buckets) == {
        "count": 6,
        "sum:amount": 680,
        "min:amount": -50,
        "max:amount": 500,
        "sum:other": 1,
    }
    assert combine([]) == {}
    assert combine([{}, {}]) == {}
    assert combine(iter(buckets)) == combine(buckets)  # any iterable, read once


BUCKET = st.fixed_dictionaries(
    {},
    optional={
        "count": st.integers(0, 100),
        "sum:a": st.integers(-1000, 1000),
        "min:a": st.integers(-1000, 1000),
        "max:a": st.integers(-1000, 1000),
        "sum:b": st.integers(-1000, 1000),
    },
)


@given(st.lists(BUCKET, max_size=8), st.randoms(use_true_random=False))
@PROPERTY
def test_combine_is_order_free_and_associative(buckets, rng):
    whole = combine(buckets)
    shuffled = list(buckets)
    rng.shuffle(shuffled)
    assert combine(shuffled) == whole
    cut = rng.randrange(len(buckets) + 1)
    assert combine([combine(buckets[:cut]), combine(buckets[cut:])]) == whole


# --- result_of ----------------------------------------------------------------------------------


def test_a_result_has_its_window_aggregates_averages_and_distinct_counts():
    w = Tumbling("per_minute", size_ms=MINUTE)
    aggregates = {"sum:amount": 10, "max:amount": 4, "count": 4, "min:amount": 1}
    result = result_of(w, 120_000, "EUR", aggregates, {"payment_methods": 2})
    assert result == {
        "window": "per_minute",
        "group": "EUR",
        "start": 60_000,
        "end": 120_000,
        "count": 4,
        "max:amount": 4,
        "min:amount": 1,
        "sum:amount": 10,
        "avg:amount": 2.5,
        "distinct:payment_methods": 2,
    }
    assert list(result)[4:8] == ["count", "max:amount", "min:amount", "sum:amount"]  # sorted
    assert isinstance(result["avg:amount"], float)


def test_a_result_s_average_is_per_value_and_exact_for_integers():
    w = Sliding("s", size_ms=30, step_ms=10)
    result = result_of(w, 30, "g", {"count": 3, "sum:a": 10, "sum:b": -3})
    assert result["start"] == 0
    assert result["avg:a"] == 10 / 3
    assert result["avg:b"] == -1.0
    assert not any(k.startswith("distinct:") for k in result)


@pytest.mark.parametrize("aggregates", [{"count": 0, "sum:a": 5, "min:a": 1}, {}, {"sum:a": 0}])
def test_an_empty_window_is_only_its_count(aggregates):
    w = Sliding("s", size_ms=30, step_ms=10)
    result = result_of(w, 30, "g", aggregates, {"d": 3})
    assert result == {"window": "s", "group": "g", "start": 0, "end": 30, "count": 0}


# --- timers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "at", "group"),
    [
        ("per_minute", 60_000, "EUR"),
        ("w", -60_000, "a:b:c"),
        ("w", 0, ""),
        ("w", 2**63 - 1, "日本円 💴"),
        ("w", -(2**63), '"quoted" \\ back\nslash'),
        ("w", 1, '[1, 2, "x"]'),
    ],
)
def test_timers_round_trip(window, at, group):
    member = encode_timer(window, at, group)
    assert isinstance(member, bytes)
    assert decode_timer(member) == (window, at, group)
    assert decode_timer(member.decode()) == (window, at, group)


@given(window=st.from_regex(r"\A[a-z][a-z0-9_]{0,10}\Z"), at=TIMES, group=st.text(max_size=20))
@PROPERTY
def test_timers_round_trip_for_any_group(window, at, group):
    member = encode_timer(window, at, group)
    assert decode_timer(member) == (window, at, group)
    assert encode_timer(window, at, group) == member  # one member per timer: ZADD dedups


def test_different_timers_are_different_members():
    members = {
        encode_timer("a", 1, "b:c"),
        encode_timer("a", 1, "b"),
        encode_timer("a", 1, "c"),
        encode_timer("a", 2, "b:c"),
        encode_timer("b", 1, "b:c"),
    }
    assert len(members) == 5


# --- sliding: incremental == from scratch -------------------------------------------------------


def _without_extremes(aggregates):
    return {k: v for k, v in aggregates.items() if not k.startswith(("min:", "max:"))}


@st.composite
def sliding_runs(draw):
    """A sliding window, its fine buckets over a stretch of time, and consecutive ends."""
    step = draw(st.integers(min_value=1, max_value=1_000))
    size = step * draw(st.integers(min_value=2, max_value=6))
    w = Sliding("s", size_ms=size, step_ms=step)
    first = draw(st.integers(min_value=-50, max_value=50)) * step
    count = draw(st.integers(min_value=1, max_value=12))
    ends = [first + i * step for i in range(count)]
    stored = {}
    for start in range(first - size, ends[-1], step):  # every fine bucket the ends need
        n = draw(st.integers(0, 4))
        bucket = {}
        if n:
            bucket["count"] = n
            amounts = draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n))
            bucket |= {"sum:a": sum(amounts), "min:a": min(amounts), "max:a": max(amounts)}
        stored[("s", start, "g")] = bucket
    return w, ends, stored


@given(sliding_runs())
@PROPERTY
def test_sliding_incrementally_equals_combining_the_window_s_fine_buckets(run):
    w, ends, stored = run
    running = combine(stored[("s", s, "g")] for s in w.bucket_starts(ends[0]))
    for end in ends[1:]:
        running = _slide(running, stored, "s", "g", w, end)
        expected = combine(stored[("s", s, "g")] for s in w.bucket_starts(end))
        # counts and sums match; extremes are not slid (the closer recombines them)
        assert running == _without_extremes(expected)
        assert not any(k.startswith(("min:", "max:")) for k in running)
        assert result_of(w, end, "g", running) == result_of(
            w, end, "g", _without_extremes(expected)
        )


def test_sliding_by_hand():
    w = Sliding("s", size_ms=30, step_ms=10)
    stored = {
        ("s", 0, "g"): {"count": 1, "sum:a": 5},
        ("s", 10, "g"): {},
        ("s", 20, "g"): {"count": 2, "sum:a": 7},
        ("s", 30, "g"): {"count": 4, "sum:a": 1},
    }
    running = combine(stored[("s", s, "g")] for s in (0, 10, 20))  # window ending at 30
    assert _slide(running, stored, "s", "g", w, 40) == {"count": 6, "sum:a": 8}  # 10, 20, 30


def test_sliding_incrementally_gives_the_same_result_when_a_value_leaves_the_window():
    w = Sliding("s", size_ms=20, step_ms=10)
    stored = {
        ("s", 0, "g"): {"count": 1, "sum:b": 4},  # the only event measuring b
        ("s", 10, "g"): {"count": 1, "sum:a": 2},
        ("s", 20, "g"): {"count": 1, "sum:a": 3},
    }
    running = combine(stored[("s", s, "g")] for s in w.bucket_starts(20))
    running = _slide(running, stored, "s", "g", w, 30)
    expected = combine(stored[("s", s, "g")] for s in w.bucket_starts(30))
    assert result_of(w, 30, "g", running) == result_of(w, 30, "g", expected)


def test_a_window_that_does_not_emit_sets_no_close_timer_but_still_expires():
    quiet = Sliding("quiet", size_ms=30, step_ms=10, emit=False)
    delta = WindowDelta()
    delta.add([quiet], 25, Measure(group="g", values={"a": 1}), 100)
    assert delta.adds == {("quiet", 20, "g"): Counter({"count": 1, "sum:a": 1})}
    assert delta.closes == {}
    assert delta.expiries == {encode_timer("quiet", 20, "g"): 50 + 100}
