"""Event time: exact epoch milliseconds, per-partition clocks and their verdicts, the settings."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.errors import ContractError
from refold.contracts.processors import LATE_POLICIES, EventTime
from refold.contracts.windows import watermark_of
from refold.processors.fold.eventtime import (
    PartitionClocks,
    Verdict,
    event_time_ms,
)
from refold.processors.fold.projection import EventRejectedError

PROPERTY = settings(max_examples=200, derandomize=True, database=None, deadline=None)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _at(ms: int) -> dt.datetime:
    """The aware UTC datetime of ``ms`` epoch milliseconds, built without a float."""
    return EPOCH + dt.timedelta(milliseconds=ms)


# --- event_time_ms ----------------------------------------------------------------------------


def test_an_aware_datetime_is_its_exact_epoch_milliseconds():
    assert event_time_ms({"t": _at(1_700_000_000_123)}, "t") == 1_700_000_000_123
    assert event_time_ms({"t": EPOCH}, "t") == 0


def test_no_float_error_where_a_float_timestamp_would_have_one():
    ms = 2_183_226_373_411  # 2039-03-07: seconds as a float, times 1000, truncates to ...410
    assert int(_at(ms).timestamp() * 1000) == ms - 1  # the float route loses a millisecond
    assert event_time_ms({"t": _at(ms)}, "t") == ms


def test_a_naive_datetime_is_taken_as_utc():
    naive = dt.datetime(2023, 11, 14, 22, 13, 20, 123_000)  # noqa: DTZ001 - on purpose
    assert event_time_ms({"t": naive}, "t") == 1_700_000_000_123


def test_another_time_zone_gives_the_same_instant():
    paris = dt.timezone(dt.timedelta(hours=1))
    local = dt.datetime(2023, 11, 14, 23, 13, 20, 123_000, tzinfo=paris)
    assert event_time_ms({"t": local}, "t") == 1_700_000_000_123


def test_sub_millisecond_parts_are_floored_even_before_the_epoch():
    assert event_time_ms({"t": _at(5) + dt.timedelta(microseconds=999)}, "t") == 5
    assert event_time_ms({"t": EPOCH - dt.timedelta(microseconds=1)}, "t") == -1
    assert event_time_ms({"t": _at(-1_000)}, "t") == -1_000


def test_an_integer_is_already_epoch_milliseconds():
    assert event_time_ms({"t": 1_700_000_000_123}, "t") == 1_700_000_000_123
    assert event_time_ms({"t": 0}, "t") == 0
    assert event_time_ms({"t": -5}, "t") == -5
    assert event_time_ms({"t": 2**62}, "t") == 2**62


@given(st.integers(min_value=-(10**13), max_value=10**14))
@PROPERTY
def test_datetime_and_integer_agree_on_every_millisecond(ms):
    assert event_time_ms({"t": _at(ms)}, "t") == ms == event_time_ms({"t": ms}, "t")


@pytest.mark.parametrize(
    "event",
    [
        {},
        {"t": None},
        {"t": True},  # a bool is an int to Python, not a time
        {"t": False},
        {"t": 1.7e12},
        {"t": "2023-11-14T22:13:20Z"},
        {"t": "1700000000123"},
        {"t": dt.date(2023, 11, 14)},
        {"t": b"\x00"},
        {"other": 1_700_000_000_123},
    ],
    ids=repr,
)
def test_a_missing_or_bad_event_time_is_rejected(event):
    with pytest.raises(EventRejectedError, match="event time field 't'"):
        event_time_ms(event, "t")


# --- PartitionClocks ----------------------------------------------------------------------------


def _clocks(lateness_ms: int = 1_000, retention_ms: int = 10_000, **stored: int):
    return PartitionClocks(
        EventTime(field="t", lateness_ms=lateness_ms, retention_ms=retention_ms), stored
    )


def test_the_first_record_of_a_partition_is_on_time_whatever_its_time():
    clocks = _clocks()
    assert clocks.observe("p/0", -(10**12)) is Verdict.ON_TIME
    assert clocks.clocks == {"p/0": -(10**12)}


def test_exactly_at_the_watermark_is_on_time_one_millisecond_below_is_late():
    clocks = _clocks(lateness_ms=1_000)
    assert clocks.observe("p/0", 10_000) is Verdict.ON_TIME
    assert clocks.observe("p/0", 9_000) is Verdict.ON_TIME  # clock - lateness: the boundary
    assert clocks.observe("p/0", 8_999) is Verdict.LATE
    assert clocks.clocks == {"p/0": 10_000}


def test_zero_lateness_makes_anything_behind_the_clock_late():
    clocks = _clocks(lateness_ms=0)
    assert clocks.observe("p/0", 10_000) is Verdict.ON_TIME
    assert clocks.observe("p/0", 10_000) is Verdict.ON_TIME  # equal is not behind
    assert clocks.observe("p/0", 9_999) is Verdict.LATE


def test_expired_is_late_beyond_the_retention_too():
    clocks = _clocks(lateness_ms=1_000, retention_ms=10_000)
    clocks.observe("p/0", 100_000)
    # watermark 99_000; expiry bound 89_000
    assert clocks.observe("p/0", 98_999) is Verdict.LATE
    assert clocks.observe("p/0", 89_000) is Verdict.LATE  # the bound itself: late, kept
    assert clocks.observe("p/0", 88_999) is Verdict.EXPIRED
    assert clocks.observe("p/0", -(10**12)) is Verdict.EXPIRED


def test_zero_retention_expires_everything_late():
    clocks = _clocks(lateness_ms=0, retention_ms=0)
    clocks.observe("p/0", 100)
    assert clocks.observe("p/0", 100) is Verdict.ON_TIME
    assert clocks.observe("p/0", 99) is Verdict.EXPIRED


def test_the_verdict_uses_the_clock_before_the_record():
    clocks = _clocks(lateness_ms=0)
    clocks.observe("p/0", 10)
    # A record far ahead is on time (and moves the clock); the next one is judged against it.
    assert clocks.observe("p/0", 1_000_000) is Verdict.ON_TIME
    assert clocks.observe("p/0", 999_999) is Verdict.LATE


def test_clocks_only_move_forward_and_changed_holds_only_moves():
    clocks = _clocks(lateness_ms=1_000, **{"p/0": 50_000, "p/1": 7})
    assert clocks.changed == {}
    clocks.observe("p/0", 49_500)  # behind, on time: the clock stays
    clocks.observe("p/0", 50_000)  # equal: stays
    assert clocks.clocks == {"p/0": 50_000, "p/1": 7}
    assert clocks.changed == {}
    clocks.observe("p/0", 10)  # late: stays
    clocks.observe("p/0", 60_000)
    clocks.observe("p/0", 55_000)
    clocks.observe("p/2", 3)
    assert clocks.clocks == {"p/0": 60_000, "p/1": 7, "p/2": 3}
    assert clocks.changed == {"p/0": 60_000, "p/2": 3}


def test_stored_clocks_are_copied_not_mutated():
    stored = {"p/0": 100}
    clocks = PartitionClocks(EventTime(field="t"), stored)
    clocks.observe("p/0", 200)
    assert stored == {"p/0": 100}


def test_partitions_are_judged_each_on_their_own_clock():
    clocks = _clocks(lateness_ms=0)
    clocks.observe("p/0", 1_000_000)
    assert clocks.observe("p/1", 5) is Verdict.ON_TIME  # p/0's clock says nothing of p/1
    assert clocks.observe("p/1", 4) is Verdict.LATE


@given(
    times=st.lists(st.integers(min_value=-(10**6), max_value=10**6), min_size=1, max_size=40),
    lateness=st.integers(min_value=0, max_value=10**5),
    retention=st.integers(min_value=0, max_value=10**5),
)
@PROPERTY
def test_verdicts_follow_the_rule_against_the_running_maximum(times, lateness, retention):
    clocks = _clocks(lateness_ms=lateness, retention_ms=retention)
    seen: int | None = None
    for at in times:
        if seen is None or at >= seen - lateness:
            expected = Verdict.ON_TIME
        elif at >= seen - lateness - retention:
            expected = Verdict.LATE
        else:
            expected = Verdict.EXPIRED
        assert clocks.observe("p/0", at) is expected
        seen = at if seen is None else max(seen, at)
        assert clocks.clocks["p/0"] == seen


# --- the processor watermark (refold.contracts.windows.watermark_of) ------------------------------


def test_the_processor_watermark_is_the_slowest_partition_minus_the_lateness():
    assert watermark_of({}, 1_000) is None
    assert watermark_of({"p/0": 50_000, "p/1": 20_000}, 1_000) == 19_000
    assert watermark_of({"p/0": 50_000}, 0) == 50_000


# --- EventTime ----------------------------------------------------------------------------------


def test_event_time_defaults():
    event_time = EventTime(field="paid_at")
    assert event_time.lateness_ms == 0
    assert event_time.late == "dead-letter"
    assert event_time.retention_ms == 7 * 24 * 3_600_000
    assert event_time.late_topic == ""


@pytest.mark.parametrize("late", LATE_POLICIES)
def test_every_late_policy_is_accepted(late):
    assert EventTime(field="t", late=late, lateness_ms=0, retention_ms=0).late == late


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"field": ""}, "event_time.field is empty"),
        ({"field": "t", "lateness_ms": -1}, "must be >= 0"),
        ({"field": "t", "retention_ms": -1}, "must be >= 0"),
        ({"field": "t", "late": "drop"}, "late must be one of dead-letter, side-output, accept"),
        ({"field": "t", "late": "Accept"}, "not 'Accept'"),
    ],
)
def test_event_time_validation(kwargs, message):
    with pytest.raises(ContractError, match=message):
        EventTime(**kwargs)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ContractError) as caught:
        EventTime(field="", lateness_ms=-1, late="nope")
    text = str(caught.value)
    assert "field is empty" in text
    assert ">= 0" in text
    assert "'nope'" in text
