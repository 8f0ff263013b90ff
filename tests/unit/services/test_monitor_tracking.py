"""Stall detection, replay rates and the progress maths, on a fake clock."""

import pytest

from refold.services.monitor.tracking import RateTracker, StallTracker, replay_progress


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


KEY = ("order_state", 1, "orders", 0)


def test_a_waiting_partition_that_does_not_move_is_stalled_after_the_threshold():
    clock = _Clock()
    stalls = StallTracker(30.0, clock)
    assert stalls.observe(KEY, 10, 5) == 0.0  # the waiting clock starts at this sample
    clock.now += 29
    assert not stalls.is_stalled(stalls.observe(KEY, 10, 7))
    clock.now += 1
    waited = stalls.observe(KEY, 10, 9)
    assert waited == 30.0
    assert stalls.is_stalled(waited)


def test_a_moving_position_restarts_the_clock():
    clock = _Clock()
    stalls = StallTracker(30.0, clock)
    stalls.observe(KEY, 10, 5)
    clock.now += 40
    assert stalls.observe(KEY, 11, 5) == 0.0  # it moved, however little
    clock.now += 29
    assert not stalls.is_stalled(stalls.observe(KEY, 11, 5))


def test_an_idle_partition_is_never_stalled_and_a_new_wait_starts_its_clock_afresh():
    clock = _Clock()
    stalls = StallTracker(30.0, clock)
    assert stalls.observe(KEY, 10, 0) is None
    clock.now += 600  # idle for ten minutes at the same position
    assert stalls.observe(KEY, 10, 0) is None
    assert stalls.observe(KEY, 10, 3) == 0.0  # records arrive: not stalled at once
    clock.now += 31
    assert stalls.is_stalled(stalls.observe(KEY, 10, 3))


def test_partitions_are_tracked_apart_and_old_ones_forgotten():
    clock = _Clock()
    stalls = StallTracker(5.0, clock)
    other = ("order_state", 2, "orders", 0)
    stalls.observe(KEY, 1, 1)
    clock.now += 10
    stalls.observe(other, 1, 1)
    assert stalls.is_stalled(stalls.observe(KEY, 1, 1))
    assert not stalls.is_stalled(stalls.observe(other, 1, 1))
    clock.now += 100
    stalls.forget_older_than(50)
    assert stalls.observe(KEY, 1, 1) == 0.0  # forgotten: a first sample again


def test_the_rate_spans_the_window_of_samples():
    clock = _Clock()
    rates = RateTracker(window_s=60, min_span_s=1, clock=clock)
    assert rates.observe("g", 0) is None
    clock.now += 0.5
    assert rates.observe("g", 10) is None  # too short a span
    clock.now += 1.5
    assert rates.observe("g", 200) == pytest.approx(100.0)
    for _ in range(10):
        clock.now += 10
        rates.observe("g", 200)  # stopped: the rate falls as old samples leave the window
    assert rates.observe("g", 200) == 0.0


def test_a_count_that_goes_back_restarts_the_rate():
    clock = _Clock()
    rates = RateTracker(clock=clock)
    rates.observe("g", 100)
    clock.now += 5
    assert rates.observe("g", 10) is None


def test_progress_from_start_to_the_log_end():
    starting = {("t", 0): 100, ("t", 1): 0}
    positions = {("t", 0): 150}
    ends = {("t", 0): 200, ("t", 1): 100}
    progress = replay_progress(starting, positions, ends, rate=10.0)
    assert (progress.done, progress.total) == (50, 200)
    assert progress.percent == 25.0
    assert progress.ratio == 0.25
    assert progress.eta_s == 15.0


def test_progress_when_done_unknown_rate_or_nothing_to_do():
    ends = {("t", 0): 10}
    done = replay_progress({}, {("t", 0): 10}, ends, rate=None)
    assert (done.percent, done.eta_s) == (100.0, 0.0)
    waiting = replay_progress({}, {("t", 0): 4}, ends, rate=None)
    assert (waiting.percent, waiting.eta_s) == (40.0, None)
    empty = replay_progress({}, {}, {}, rate=None)
    assert (empty.total, empty.percent, empty.eta_s) == (0, 100.0, 0.0)
    # a position past the end counted (e.g. an end read a moment earlier) is capped
    past = replay_progress({}, {("t", 0): 12}, ends, rate=1.0)
    assert (past.done, past.percent) == (10, 100.0)
