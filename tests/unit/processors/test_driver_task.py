"""Driver tasks: rounds after batches, and nudges while the processor is idle."""

from __future__ import annotations

import threading

from refold.contracts.layout import StateLayout
from refold.contracts.processors import EventTime
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.runtime.window_store import WindowCloser


class _Counting(DriverTask):
    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0
        self.ran = threading.Event()

    def run(self) -> int:
        self.rounds += 1
        self.done += 1
        self.ran.set()
        return 1


def test_a_nudge_runs_a_round_and_leaves_the_batch_count_to_the_next_request() -> None:
    task = _Counting()
    task.nudge()
    assert task.ran.wait(5)
    assert task.rounds == 1
    assert task.request() == 1  # the nudged round's work is reported with the next batch
    task.stop()  # one last round in this thread
    rounds = task.rounds
    task.nudge()  # stopped: no new thread, no round
    assert task.rounds == rounds
    assert task._thread is None


def test_a_lookup_joiner_has_idle_rounds_and_a_window_closer_has_not() -> None:
    joiner = LookupJoiner(
        StateLayout("enriched_clicks"),
        1,
        EnrichedClicksProjection(),
        EventTime(field="occurred_at"),
        60_000,
        "redis://127.0.0.1:1/0",  # not connected until a round runs
        {"bootstrap.servers": "unused:1"},
        "enriched_clicks.dlq",
    )
    assert joiner.idle_rounds  # its table's watermark moves without its batches
    assert not WindowCloser.idle_rounds  # its windows close only with its own clocks
