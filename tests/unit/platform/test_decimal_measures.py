"""Decimal window measures: stored as exact integers of their scale, reported in the user's units.

Sums of decimals must not depend on the order of the additions (a replay adds in another order
than the live run), so a decimal measure is stored as ``round_half_even(value * 10**scale)``
and summed as an integer; plain float sums would not be order-free (the last test shows why).
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.codec import EventCodec
from refold.contracts.errors import ContractError
from refold.contracts.windows import (
    WINDOW_RESULT,
    from_units,
    result_from_record,
    result_record,
    scales_from_meta,
    scales_of,
    to_units,
    window_meta,
    windows_from_meta,
)
from refold.processors.fold.projection import EventRejectedError
from refold.processors.fold.windows import (
    Measure,
    Tumbling,
    WindowDelta,
    combine,
    result_of,
    scaled,
)
from refold.services.query.reads import etag_of, json_default

PROPERTY = settings(max_examples=200, derandomize=True, database=None, deadline=None)
MINUTE = 60_000


@pytest.mark.parametrize(
    ("value", "scale", "units"),
    [
        (21, 2, 2100),
        (Decimal("21.5"), 2, 2150),
        (0.1, 2, 10),  # the float 0.1 is read as the decimal 0.1, not 0.1000000000000000055...
        (-3.25, 1, -32),  # half to even
        (0.125, 2, 12),
        (0.135, 2, 14),
        (Decimal("-0.0049"), 2, 0),
        (12345678901.25, 2, 1234567890125),
        (7, None, 7),
    ],
)
def test_a_value_is_stored_as_integer_units_of_its_scale(value, scale, units):
    assert to_units("m", value, scale) == units


@pytest.mark.parametrize(
    ("value", "scale", "says"),
    [
        (1.5, None, "not an integer: declare its scale"),
        (Decimal("2"), None, "not an integer"),
        ("1.5", 2, "not a number"),
        (None, 2, "not a number"),
        (True, 2, "not a number"),
        (float("nan"), 2, "not a finite number"),
        (float("inf"), 2, "not a finite number"),
        (Decimal("1e20"), 2, "out of the 64-bit range"),
        (2**63, None, "out of the 64-bit range"),
    ],
)
def test_a_value_that_is_not_a_number_of_its_kind_is_refused_by_name(value, scale, says):
    with pytest.raises(ValueError, match=says) as caught:
        to_units("celsius", value, scale)
    assert "'celsius'" in str(caught.value)


def test_a_refused_value_rejects_the_event_so_it_goes_to_the_dead_letters():
    with pytest.raises(EventRejectedError, match="measure 'celsius' is 'hot', not a number"):
        scaled(Measure("g", {"celsius": "hot"}), {"celsius": 2})
    assert scaled(Measure("g", {"celsius": 0.5, "n": 2}), {"celsius": 2}) == Measure(
        "g", {"celsius": 50, "n": 2}
    )


class _Fold:
    scales = {"celsius": 2}  # noqa: RUF012 - a fold's declaration, as a user writes it


@pytest.mark.parametrize("scales", [{"c": -1}, {"c": 19}, {"c": 1.5}, {"c": True}, {"c": "2"}])
def test_a_scale_is_an_integer_from_0_to_18(scales):
    fold = type("F", (), {"scales": scales})()
    with pytest.raises(ContractError, match="'c': a scale is an integer from 0 to 18"):
        scales_of(fold)


def test_scales_are_declared_by_the_fold_and_recorded_for_readers():
    assert scales_of(object()) == {}
    assert scales_of(_Fold()) == {"celsius": 2}
    meta = window_meta([Tumbling("m", size_ms=MINUTE)], ("d",), scales_of(_Fold()))
    assert scales_from_meta(meta) == {"celsius": 2}
    assert windows_from_meta(meta) == ([Tumbling("m", size_ms=MINUTE)], ["d"])
    assert scales_from_meta({"windows": "[]"}) == {}  # a generation built before scales existed
    with pytest.raises(ContractError, match="window scales are not readable"):
        scales_from_meta({"scales": "[1]"})


def test_a_result_reports_decimal_measures_in_the_user_s_units():
    w = Tumbling("per_minute", size_ms=MINUTE)
    aggregates = {"count": 4, "sum:celsius": 8625, "min:celsius": 1950, "max:celsius": 2300}
    aggregates |= {"sum:n": 9}
    result = result_of(w, MINUTE, "room-1", aggregates, scales={"celsius": 2})
    assert result["sum:celsius"] == Decimal("86.25")
    assert result["min:celsius"] == Decimal("19.50")
    assert result["max:celsius"] == Decimal("23.00")
    assert result["avg:celsius"] == 21.5625
    assert result["sum:n"] == 9
    assert isinstance(result["sum:n"], int)
    assert result["avg:n"] == 2.25


def test_a_window_result_record_keeps_exact_units_and_its_scales_through_avro():
    w = Tumbling("per_minute", size_ms=MINUTE)
    aggregates = {"count": 3, "sum:celsius": -1234567890125, "min:celsius": -5, "max:celsius": 7}
    result = result_of(w, MINUTE, "g", aggregates, {"d": 2}, {"celsius": 2})
    record = result_record("rooms", result, {"celsius": 2})
    assert record["aggregates"]["sum:celsius"] == -1234567890125
    assert record["scales"] == {"celsius": 2}
    codec = EventCodec()
    decoded = codec.decode(codec.encode(WINDOW_RESULT, record)).data
    assert result_from_record(decoded) == result
    assert result_from_record(decoded)["sum:celsius"] == Decimal("-12345678901.25")


def test_a_version_1_record_has_no_scales_and_reads_as_integers():
    record = result_record("p", result_of(Tumbling("w", size_ms=10), 10, "g", {"count": 1}))
    del record["scales"]
    assert result_from_record(record)["count"] == 1


def test_the_http_answer_carries_a_decimal_as_a_json_number():
    assert json_default(Decimal("86.25")) == 86.25
    with pytest.raises(TypeError, match="set is not JSON serialisable"):
        json_default({1})
    assert etag_of(1, {"sum:celsius": Decimal("86.25")}) == etag_of(1, {"sum:celsius": 86.25})


_VALUES = st.lists(
    st.decimals(min_value=-10_000, max_value=10_000, allow_nan=False, places=4), max_size=60
)


@PROPERTY
@given(_VALUES, st.randoms(use_true_random=False))
def test_decimal_sums_are_exact_whatever_the_order_and_the_transactions(values, rng):
    """Any order and any split into transactions (as partitions and replays add): one result."""
    w = Tumbling("w", size_ms=MINUTE)
    scales = {"x": 4}

    def buckets(order: list[Decimal], cuts: int) -> dict[str, int]:
        parts = []
        for i in range(cuts):
            delta = WindowDelta()
            for value in order[i::cuts]:
                delta.add([w], 0, scaled(Measure("g", {"x": value}), scales), MINUTE)
            bucket = dict(delta.adds.get(("w", 0, "g"), {}))
            for (*_b, name), v in {**delta.lows, **delta.highs}.items():
                bucket[name] = v
            parts.append(bucket)
        return combine(parts)

    shuffled = list(values)
    rng.shuffle(shuffled)
    first = result_of(w, MINUTE, "g", buckets(values, 1), scales=scales)
    again = result_of(w, MINUTE, "g", buckets(shuffled, rng.randint(1, 5)), scales=scales)
    assert first == again
    if values:
        assert first["sum:x"] == sum(values)
        assert first["min:x"] == min(values)
        assert first["max:x"] == max(values)
        assert from_units(to_units("x", values[0], 4), 4) == values[0]


def test_why_float_sums_are_not_offered():
    """Float addition is not associative: the same values in another order sum differently."""
    values = [0.1, 0.2, 0.3] * 50 + [1e16, -1e16]
    sums = {sum(random.Random(seed).sample(values, len(values))) for seed in range(20)}
    assert len(sums) > 1
    exact = {
        sum(to_units("x", v, 2) for v in random.Random(seed).sample(values, len(values)))
        for seed in range(20)
    }
    assert exact == {3000}
