"""The window oracle: its verdicts and buckets do not depend on how partitions interleave.

Live processing reads each partition in log order, but how the partitions' records meet in a
micro-batch (and where the batches cut) differs between a live run and every replay. The
decisive property: folding the same partition logs in any interleaving, or in batches that
carry only the stored clocks from one to the next, gives the same buckets, late records and
clocks. Then two hand-computed examples for the shipped window processors.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.layout import StateLayout
from refold.contracts.processors import EventTime
from refold.processors.fold.eventtime import PartitionClocks, Verdict, event_time_ms
from refold.processors.fold.oracle import WindowOracle, fold_windows
from refold.processors.fold.projection import EventRejectedError
from refold.processors.fold.windows import Measure, Tumbling, WindowDelta, combine
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.unique_visitors.config import UNIQUE_VISITORS
from refold.processors.unique_visitors.projection import UniqueVisitors

PROPERTY = settings(max_examples=150, derandomize=True, database=None, deadline=None)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
SALES = SalesWindows()
VISITORS = UniqueVisitors()

Record = tuple[str, int, str, Mapping[str, Any]]


def _at(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


# --- strategies ---------------------------------------------------------------------------------

BASE = 1_700_000_040_000  # a whole minute


@st.composite
def payment(draw) -> tuple[str, dict[str, Any]]:
    """An OrderPaid (sometimes broken, sometimes another type) around BASE, +- a few minutes."""
    at = BASE + draw(st.integers(min_value=-200_000, max_value=400_000))
    event: dict[str, Any] = {
        "order_id": "o",
        "currency": draw(st.sampled_from(["EUR", "USD", "JPY:x"])),
        "amount_minor": draw(st.integers(min_value=-500, max_value=5_000)),
        "payment_method": draw(st.sampled_from(["CARD", "WALLET", "BANK_TRANSFER"])),
        "paid_at": draw(st.sampled_from([_at(at), at])),
    }
    kind = draw(st.sampled_from(["ok"] * 8 + ["other type", "no time", "no currency"]))
    if kind == "other type":
        return "OrderShipped", event
    if kind == "no time":
        del event["paid_at"]
    elif kind == "no currency":
        del event["currency"]  # measure() raises: the record is dead-lettered
    return "OrderPaid", event


EVENT_TIMES = st.builds(
    EventTime,
    field=st.just("paid_at"),
    lateness_ms=st.sampled_from([0, 1, 30_000, 90_000]),
    late=st.sampled_from(["dead-letter", "side-output", "accept"]),
    retention_ms=st.sampled_from([0, 60_000, 24 * 3_600_000]),
)


@st.composite
def partition_logs(draw) -> dict[str, list[Record]]:
    """Each partition's records, in log order (offsets count up from a random start)."""
    logs = {}
    for p in range(draw(st.integers(min_value=1, max_value=4))):
        name = f"commerce.orders/{p}"
        first = draw(st.integers(min_value=0, max_value=1_000))
        events = draw(st.lists(payment(), max_size=25))
        logs[name] = [(name, first + i, t, e) for i, (t, e) in enumerate(events)]
    return logs


@st.composite
def interleaving(draw, logs: Mapping[str, list[Record]]) -> list[Record]:
    """Any merge of the logs that keeps each partition's own order."""
    queues = {p: list(records) for p, records in logs.items() if records}
    merged = []
    while queues:
        p = draw(st.sampled_from(sorted(queues)))
        merged.append(queues[p].pop(0))
        if not queues[p]:
            del queues[p]
    return merged


def _same(a: WindowOracle, b: WindowOracle) -> None:
    assert a.buckets == b.buckets
    assert a.distinct == b.distinct
    assert a.clocks == b.clocks
    # The late list is in processing order; per partition it is the same sequence.
    assert sorted(a.late) == sorted(b.late)
    for p in {p for p, _ in a.late}:
        assert [o for q, o in a.late if q == p] == [o for q, o in b.late if q == p]


# --- the decisive property ----------------------------------------------------------------------


@given(data=st.data(), logs=partition_logs(), event_time=EVENT_TIMES)
@PROPERTY
def test_any_interleaving_of_the_partitions_gives_the_same_result(data, logs, event_time):
    one_by_one = [r for p in sorted(logs) for r in logs[p]]
    reference = fold_windows(SALES, event_time, one_by_one)
    merged = data.draw(interleaving(logs))
    _same(fold_windows(SALES, event_time, merged), reference)
    backwards = [r for p in sorted(logs, reverse=True) for r in logs[p]]
    _same(fold_windows(SALES, event_time, backwards), reference)


def _in_batches(
    fold: SalesWindows, event_time: EventTime, batches: Iterable[list[Record]]
) -> WindowOracle:
    """As the live writer does: per batch, fresh clocks from the stored ones, then a delta."""
    stored: dict[str, int] = {}
    buckets: dict[tuple[str, int, str], list[dict[str, int]]] = {}
    distinct: dict[tuple[str, str, int, str], set[str]] = {}
    late: list[tuple[str, int]] = []
    for batch in batches:
        clocks = PartitionClocks(event_time, stored)
        delta = WindowDelta()
        for partition, offset, event_type, event in batch:
            if event_type not in fold.event_types:
                continue
            try:
                at = event_time_ms(event, event_time.field)
            except EventRejectedError:
                continue
            verdict = clocks.observe(partition, at)
            if verdict is not Verdict.ON_TIME:
                late.append((partition, offset))
                if verdict is Verdict.EXPIRED or event_time.late != "accept":
                    continue
            try:
                measures = list(fold.measure(event_type, event))
            except KeyError:
                continue
            for measure in measures:
                delta.add(fold.windows, at, measure, event_time.retention_ms)
        stored = {**stored, **clocks.changed}  # only what moved is written back
        for bucket, counts in delta.adds.items():
            buckets.setdefault(bucket, []).append(dict(counts))
        for (w, s, g, name), value in {**delta.lows, **delta.highs}.items():
            buckets[(w, s, g)].append({name: value})
        for key, values in delta.distinct.items():
            distinct.setdefault(key, set()).update(values)
    out = WindowOracle()
    out.buckets = {b: combine(parts) for b, parts in buckets.items()}
    out.distinct = distinct
    out.late = late
    out.clocks = stored
    return out


@given(data=st.data(), logs=partition_logs(), event_time=EVENT_TIMES)
@PROPERTY
def test_micro_batches_carrying_only_the_stored_clocks_agree_with_the_oracle(
    data, logs, event_time
):
    merged = data.draw(interleaving(logs))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(merged)), max_size=6)))
    bounds = [0, *cuts, len(merged)]
    batches = [merged[a:b] for a, b in itertools.pairwise(bounds)]
    _same(_in_batches(SALES, event_time, batches), fold_windows(SALES, event_time, merged))


# --- late policies ------------------------------------------------------------------------------


class _Counts:
    """Counts events per 10 ms of event time."""

    name = "counts"
    event_types = ("E",)
    windows = (Tumbling("t", size_ms=10),)
    distinct = ()

    def measure(self, event_type: str, event: Mapping[str, Any]) -> list[Measure]:
        del event_type, event
        return [Measure(group="g")]


# lateness 5, retention 20: after 100 the watermark is 95 and the expiry bound 75
_LOG: list[Record] = [
    ("p", 0, "E", {"t": 100}),  # on time
    ("p", 1, "E", {"t": 95}),  # at the watermark: on time
    ("p", 2, "E", {"t": 94}),  # late
    ("p", 3, "E", {"t": 75}),  # late, at the expiry bound: still kept under accept
    ("p", 4, "E", {"t": 74}),  # expired
    ("q", 0, "E", {"t": 3}),  # another partition: its own clock, on time
]


@pytest.mark.parametrize(
    ("late", "buckets"),
    [
        ("dead-letter", {100: 1, 90: 1, 0: 1}),
        ("side-output", {100: 1, 90: 1, 0: 1}),
        ("accept", {100: 1, 90: 2, 70: 1, 0: 1}),
    ],
)
def test_late_policies(late, buckets):
    event_time = EventTime(field="t", lateness_ms=5, retention_ms=20, late=late)
    result = fold_windows(_Counts(), event_time, _LOG)
    assert {s: b["count"] for (_w, s, _g), b in result.buckets.items()} == buckets
    assert result.late == [("p", 2), ("p", 3), ("p", 4)]  # every verdict but on time
    assert result.clocks == {"p": 100, "q": 3}


def test_records_the_fold_does_not_count_move_no_clock():
    event_time = EventTime(field="t", lateness_ms=0)
    log: list[Record] = [
        ("p", 0, "Other", {"t": 1_000}),  # not its type
        ("p", 1, "E", {"t": "soon"}),  # no event time
        ("p", 2, "E", {"t": 10}),
    ]
    result = fold_windows(_Counts(), event_time, log)
    assert result.late == []
    assert result.clocks == {"p": 10}
    assert set(result.buckets) == {("t", 10, "g")}


def test_a_record_the_fold_refuses_still_moves_its_partition_s_clock():
    """As the live writer: its time was read before measure() raised; the next one is late."""
    event_time = EventTime(field="paid_at", lateness_ms=0)
    log: list[Record] = [
        ("p", 0, "OrderPaid", {"paid_at": 1_000}),  # no currency: measure() raises
        ("p", 1, "OrderPaid", {"paid_at": 999, "currency": "EUR", "amount_minor": 1,
                               "payment_method": "CARD"}),
    ]  # fmt: skip
    result = fold_windows(SALES, event_time, log)
    assert result.buckets == {}
    assert result.late == [("p", 1)]
    assert result.clocks == {"p": 1_000}


# --- SalesWindows, by hand ----------------------------------------------------------------------

T0 = BASE  # 2023-11-14T22:14:00Z, a whole minute
P0, P1 = "commerce.orders/0", "commerce.orders/1"


def _paid(order: str, after_ms: int, currency: str, amount: int, method: str) -> dict[str, Any]:
    return {
        "event_id": f"e-{order}",
        "order_id": order,
        "amount_minor": amount,
        "currency": currency,
        "payment_method": method,
        "paid_at": _at(T0 + after_ms),
    }


SALES_LOG: list[Record] = [
    (P0, 0, "OrderPaid", _paid("a", 5_000, "EUR", 1_000, "CARD")),
    (P1, 0, "OrderPaid", _paid("b", 12_000, "EUR", 300, "WALLET")),
    (P0, 1, "OrderPaid", _paid("c", 20_000, "USD", 250, "WALLET")),
    (P1, 1, "OrderPaid", _paid("d", 59_999, "EUR", 700, "CARD")),
    (P0, 2, "OrderPaid", _paid("e", 61_000, "EUR", 50, "BANK_TRANSFER")),
    (P1, 2, "OrderPaid", _paid("f", 65_000, "USD", 900, "CARD")),
    # P1's clock is T0+65s, its watermark T0+35s: 30 s is late (dead-lettered)
    (P1, 3, "OrderPaid", _paid("g", 30_000, "EUR", 10_000, "CARD")),
    # P0's clock is T0+61s, its watermark T0+31s: exactly at it, on time (minute 0)
    (P0, 3, "OrderPaid", _paid("h", 31_000, "EUR", 40, "CARD")),
    (P0, 4, "OrderShipped", {"order_id": "a", "shipped_at": _at(T0 + 600_000)}),  # not counted
    (P1, 4, "OrderPaid", {k: v for k, v in _paid("i", 1, "EUR", 1, "CARD").items()
                          if k != "paid_at"}),  # no event time
]  # fmt: skip


def _expected(window, start, end, group, amounts, methods):
    """A result as the closer emits it, from plain numbers."""
    return {
        "window": window,
        "group": group,
        "start": start,
        "end": end,
        "count": len(amounts),
        "max:amount_minor": max(amounts),
        "min:amount_minor": min(amounts),
        "sum:amount_minor": sum(amounts),
        "avg:amount_minor": sum(amounts) / len(amounts),
        "distinct:payment_methods": len(set(methods)),
    }


def test_sales_windows_by_hand():
    fold = SALES
    per_minute, hopping, sliding = fold.windows
    result = fold_windows(fold, SALES_WINDOWS.event_time, SALES_LOG)
    assert SALES_WINDOWS.event_time.lateness_ms == 30_000
    assert result.late == [(P1, 3)]
    assert result.clocks == {P0: T0 + 61_000, P1: T0 + 65_000}

    # Per minute: minute 0 has a, b, d, h in EUR (not g: late) and c in USD; minute 1 e and f.
    minute = {
        (key[1], key[2]): bucket
        for key, bucket in result.buckets.items()
        if key[0] == per_minute.name
    }
    assert minute == {
        (T0, "EUR"): {"count": 4, "sum:amount_minor": 2_040, "min:amount_minor": 40,
                      "max:amount_minor": 1_000},
        (T0, "USD"): {"count": 1, "sum:amount_minor": 250, "min:amount_minor": 250,
                      "max:amount_minor": 250},
        (T0 + 60_000, "EUR"): {"count": 1, "sum:amount_minor": 50, "min:amount_minor": 50,
                               "max:amount_minor": 50},
        (T0 + 60_000, "USD"): {"count": 1, "sum:amount_minor": 900, "min:amount_minor": 900,
                               "max:amount_minor": 900},
    }  # fmt: skip
    first = result.window(per_minute, T0 + 60_000, "EUR")
    assert first == {
        "window": "per_minute",
        "group": "EUR",
        "start": T0,
        "end": T0 + 60_000,
        "count": 4,
        "max:amount_minor": 1_000,
        "min:amount_minor": 40,
        "sum:amount_minor": 2_040,
        "avg:amount_minor": 510.0,  # 2040 / 4
        "distinct:payment_methods": 2,  # CARD, WALLET
    }
    assert result.window(per_minute, T0 + 60_000, "USD") == _expected(
        "per_minute", T0, T0 + 60_000, "USD", [250], ["WALLET"]
    )
    assert result.window(per_minute, T0 + 120_000, "EUR") == _expected(
        "per_minute", T0 + 60_000, T0 + 120_000, "EUR", [50], ["BANK_TRANSFER"]
    )
    assert result.window(per_minute, T0 + 120_000, "USD") == _expected(
        "per_minute", T0 + 60_000, T0 + 120_000, "USD", [900], ["CARD"]
    )
    assert result.window(per_minute, T0 + 180_000, "EUR") == {
        "window": "per_minute", "group": "EUR", "start": T0 + 120_000, "end": T0 + 180_000,
        "count": 0,
    }  # fmt: skip

    # Five minutes hopping by one: the window [T0, T0+5min) has both minutes.
    assert result.window(hopping, T0 + 300_000, "EUR") == {
        "window": "five_minutes_hopping",
        "group": "EUR",
        "start": T0,
        "end": T0 + 300_000,
        "count": 5,
        "max:amount_minor": 1_000,
        "min:amount_minor": 40,
        "sum:amount_minor": 2_090,
        "avg:amount_minor": 418.0,  # 2090 / 5
        "distinct:payment_methods": 3,
    }
    # [T0+1min, T0+6min) has minute 1 only
    assert result.window(hopping, T0 + 360_000, "USD") == _expected(
        "five_minutes_hopping", T0 + 60_000, T0 + 360_000, "USD", [900], ["CARD"]
    )
    # Each event is in five hopping windows: minute 0's four EUR payments in those starting
    # T0-4min .. T0, minute 1's one in those starting T0-3min .. T0+1min.
    hopping_eur = {s: b["count"] for (w, s, g), b in result.buckets.items()
                   if w == hopping.name and g == "EUR"}  # fmt: skip
    assert hopping_eur == {
        T0 - 240_000: 4, T0 - 180_000: 5, T0 - 120_000: 5, T0 - 60_000: 5, T0: 5,
        T0 + 60_000: 1,
    }  # fmt: skip

    # Five minutes sliding by 10 s: [T0+10s, T0+310s) leaves out a (T0+5s).
    assert result.window(sliding, T0 + 310_000, "EUR") == {
        "window": "five_minutes_sliding",
        "group": "EUR",
        "start": T0 + 10_000,
        "end": T0 + 310_000,
        "count": 4,  # b, d, e, h
        "max:amount_minor": 700,
        "min:amount_minor": 40,
        "sum:amount_minor": 1_090,
        "avg:amount_minor": 272.5,
        "distinct:payment_methods": 3,  # WALLET, CARD, BANK_TRANSFER
    }
    assert result.window(sliding, T0 + 310_000, "USD") == _expected(
        "five_minutes_sliding", T0 + 10_000, T0 + 310_000, "USD", [250, 900], ["WALLET", "CARD"]
    )
    # [T0+20s, T0+320s) still has c (T0+20s: the start is in), [T0+30s, ...) does not.
    assert result.window(sliding, T0 + 320_000, "USD")["count"] == 2
    assert result.window(sliding, T0 + 330_000, "USD") == _expected(
        "five_minutes_sliding", T0 + 30_000, T0 + 330_000, "USD", [900], ["CARD"]
    )


def test_sales_windows_accepting_late_payments_counts_the_late_one():
    event_time = EventTime(field="paid_at", lateness_ms=30_000, late="accept")
    result = fold_windows(SALES, event_time, SALES_LOG)
    assert result.late == [(P1, 3)]
    assert result.window(SALES.windows[0], T0 + 60_000, "EUR") == _expected(
        "per_minute", T0, T0 + 60_000, "EUR", [1_000, 300, 700, 10_000, 40], ["CARD", "WALLET"]
    )


# --- UniqueVisitors, by hand --------------------------------------------------------------------

H0 = 1_699_999_200_000  # 2023-11-14T22:00:00Z, a whole hour
MIN = 60_000
V0, V1, V2 = "web.pageviews/0", "web.pageviews/1", "web.pageviews/2"


def _view(visitor: str, device: str, after_ms: int) -> dict[str, Any]:
    return {
        "event_id": f"pv-{visitor}-{after_ms}",
        "session_id": f"s-{visitor}",
        "visitor_id": visitor,
        "customer_id": None,
        "url": "https://shop.example/",
        "path": "/",
        "page_type": "HOME",
        "sku": None,
        "referrer": None,
        "device": device,
        "occurred_at": _at(H0 + after_ms),
    }


VISITS_LOG: list[Record] = [
    (V0, 0, "PageViewed", _view("v1", "DESKTOP", 1 * MIN)),
    (V0, 1, "PageViewed", _view("v2", "MOBILE", 2 * MIN)),
    (V1, 0, "PageViewed", _view("v3", "TABLET", 10 * MIN)),
    (V0, 2, "PageViewed", _view("v1", "MOBILE", 3 * MIN)),
    (V1, 1, "PageViewed", _view("v2", "MOBILE", 70 * MIN)),
    (V0, 3, "PageViewed", _view("v1", "DESKTOP", 59 * MIN)),
    # V1's clock is H0+70min, its watermark H0+69min: late, accepted into hour 0
    (V1, 2, "PageViewed", _view("v2", "MOBILE", 50 * MIN)),
    (V2, 0, "PageViewed", _view("v1", "DESKTOP", 61 * MIN)),
    (V2, 1, "PageViewed", _view("v5", "OTHER", 61 * MIN)),
    (V2, 2, "PageViewed", _view("v1", "DESKTOP", 61 * MIN)),  # again: one visitor
]


def test_unique_visitors_by_hand():
    assert UNIQUE_VISITORS.event_time.late == "accept"
    hourly = VISITORS.windows[0]
    result = fold_windows(VISITORS, UNIQUE_VISITORS.event_time, VISITS_LOG)
    assert result.late == [(V1, 2)]
    assert result.clocks == {V0: H0 + 59 * MIN, V1: H0 + 70 * MIN, V2: H0 + 61 * MIN}

    hour0, hour1 = H0 + 60 * MIN, H0 + 120 * MIN
    # (end, group) -> (page views, distinct visitors), counted by hand from VISITS_LOG
    expected = {
        (hour0, "all"): (6, 3),  # v1 x3, v2 x2 (one late), v3
        (hour0, "desktop"): (2, 1),  # v1 twice
        (hour0, "mobile"): (3, 2),  # v2, v1, v2 (late)
        (hour0, "tablet"): (1, 1),  # v3
        (hour1, "all"): (4, 3),  # v2, v1, v5, v1
        (hour1, "mobile"): (1, 1),  # v2
        (hour1, "desktop"): (2, 1),  # v1 twice
        (hour1, "other"): (1, 1),  # v5
    }
    got = {(s + hourly.size_ms, g) for (_w, s, g) in result.buckets}
    assert got == set(expected)
    for (end, group), (views, visitors) in expected.items():
        assert result.window(hourly, end, group) == {
            "window": "hourly",
            "group": group,
            "start": end - 3_600_000,
            "end": end,
            "count": views,
            "distinct:visitors": visitors,
        }
    assert result.distinct[("hourly", "visitors", H0, "all")] == {"v1", "v2", "v3"}
    assert result.distinct[("hourly", "visitors", H0 + 60 * MIN, "all")] == {"v1", "v2", "v5"}


def test_unique_visitors_are_the_same_whatever_the_interleaving():
    reference = fold_windows(VISITORS, UNIQUE_VISITORS.event_time, VISITS_LOG)
    by_partition = sorted(VISITS_LOG, key=lambda r: (r[0], r[1]))
    _same(fold_windows(VISITORS, UNIQUE_VISITORS.event_time, by_partition), reference)
    reverse = sorted(VISITS_LOG, key=lambda r: (-int(r[0][-1]), r[1]))
    _same(fold_windows(VISITORS, UNIQUE_VISITORS.event_time, reverse), reference)


# --- the closer's results (incremental sliding) equal the oracle's ------------------------------


def _reads(oracle: WindowOracle, due):
    """What ``WindowCloser._read`` returns for ``due``, from the oracle's exact buckets."""
    windows = {w.name: w for w in SALES.windows}
    stored, distinct = {}, {}
    for name, end, group in due:
        starts = windows[name].bucket_starts(end)
        for start in starts:
            stored[(name, start, group)] = dict(oracle.buckets.get((name, start, group), {}))
        for measure in SALES.distinct:
            seen = [oracle.distinct.get((name, measure, s, group), set()) for s in starts]
            distinct.setdefault((name, end, group), {})[measure] = len(set().union(*seen))
    return stored, distinct


@given(data=st.data(), logs=partition_logs())
@PROPERTY
def test_the_closer_s_results_equal_the_oracle_s_windows(data, logs):
    event_time = SALES_WINDOWS.event_time
    oracle = fold_windows(SALES, event_time, [r for p in sorted(logs) for r in logs[p]])
    windows = {w.name: w for w in SALES.windows}
    every_end = sorted(
        {(w, e, g) for (w, s, g) in oracle.buckets for e in windows[w].ends(s)},
        key=lambda t: (t[0], t[2], t[1]),
    )
    # Any subset is due at once (consecutive ends slide, gaps start afresh).
    due = [t for t in every_end if data.draw(st.integers(0, 3), label="due") > 0]
    layout = StateLayout("sales_windows", prefix="test")
    closer = WindowCloser(layout, 1, SALES, event_time.lateness_ms, "redis://unused", {})
    got = closer._results(due, *_reads(oracle, due))
    assert got == [oracle.window(windows[w], e, g) for w, e, g in due]
