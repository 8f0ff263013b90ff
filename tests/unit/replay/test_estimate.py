"""The replay plan's estimate: a past rebuild's measured rate, and where it came from (pure)."""

from refold.replay.plan import ToEarliest, build_plan
from refold.replay.validate import RebuildRate, estimate_check, rebuild_rate_of

BOUNDS = {("orders", 0): (0, 60_000), ("orders", 1): (0, 42_040)}


def test_the_rate_is_records_over_the_batches_time_and_the_rest_is_start_up():
    rate = rebuild_rate_of(
        4,
        {
            "rebuild_events": "51020",
            "rebuild_seconds": "8.600",
            "rebuild_batch_seconds": "5.102",
        },
    )
    assert rate == RebuildRate(4, 51_020, 8.6, 5.102)
    assert round(rate.per_s) == 10_000
    assert round(rate.startup_s, 3) == 3.498
    plan = build_plan("p", ToEarliest(), BOUNDS, {}, 4)  # 102,040 records
    check = estimate_check(plan, rate)
    assert check.ok
    assert check.detail == (
        "102040 records at 10,000 records/s (measured by the rebuild of g4: 51,020 records in "
        "5.1s of micro-batches (the processor's stats) after 3.5s of start-up): about 14s "
        "including start-up"
    )


def test_without_batch_times_the_rate_is_over_the_whole_rebuild_and_the_old_rate_is_ignored():
    # What the rebuild of the issue recorded: its record count as its "rate".
    rate = rebuild_rate_of(
        4, {"rebuild_events": "51020", "rebuild_seconds": "8.6", "rebuild_rate": "51020"}
    )
    assert rate is not None
    assert round(rate.per_s) == 5_933
    assert rate.startup_s == 0.0
    plan = build_plan("p", ToEarliest(), BOUNDS, {}, 4)
    detail = estimate_check(plan, rate).detail
    assert "at 5,933 records/s (measured by the rebuild of g4: 51,020 records in 8.6s, " in detail
    assert "start-up included): about 17s" in detail


def test_batches_longer_than_the_wall_time_are_not_trusted():
    rate = rebuild_rate_of(
        2, {"rebuild_events": "100", "rebuild_seconds": "10", "rebuild_batch_seconds": "12"}
    )
    assert rate is not None
    assert (rate.per_s, rate.startup_s) == (10.0, 0.0)


def test_a_rebuild_that_measured_nothing_gives_no_rate():
    assert rebuild_rate_of(3, {}) is None
    assert rebuild_rate_of(3, {"rebuild_events": "0", "rebuild_seconds": "4"}) is None
    assert rebuild_rate_of(3, {"rebuild_events": "x", "rebuild_seconds": "4"}) is None
    plan = build_plan("p", ToEarliest(), BOUNDS, {}, 3)
    assert estimate_check(plan, None).detail == (
        "102040 records; no measured rebuild yet to estimate the time"
    )
