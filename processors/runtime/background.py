"""Driver-side work that runs beside the next micro-batch: window closing, table lookups.

A processor query's ``foreachBatch`` asks for a round (:meth:`DriverTask.request`) after each
micro-batch; the round runs in a background thread while Spark plans and runs the next batch.
The rounds only read committed state and change Redis in guarded steps of their own (a timer
is settled, a lookup applied, exactly once), so they need no lock with the batches. A failed
round is logged and its work stays where it was: the next round does it.

A task whose work can come without a batch of its own (:attr:`DriverTask.idle_rounds`: a lookup
joiner, whose table's watermark moves with another processor's batches) is also nudged by the
query loop while its processor is idle, so an idle processor's waiting lookups are joined once
the table passes them, not at its next record. What a round does never depends on when it runs.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

from refold.processors.errors import REDIS_UNAVAILABLE

__all__ = ["DriverTask"]

logger = logging.getLogger(__name__)


class DriverTask(ABC):
    """Runs :meth:`run` in one background thread, once per request (requests coalesce)."""

    label = "driver task"
    idle_rounds = False  # whether a round can find work with no batch since the last one

    def __init__(self) -> None:
        self.done = 0
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._reported = 0

    @abstractmethod
    def run(self) -> int:
        """One round; returns how many things it did (windows emitted, events joined)."""

    def request(self) -> int:
        """Ask for a round (after a batch); how many things were done since last asked."""
        self.nudge()
        done, self._reported = self.done - self._reported, self.done
        return done

    def nudge(self) -> None:
        """Ask for a round without a batch (the query loop, for :attr:`idle_rounds` tasks)."""
        with self._starting:  # the batch's thread and the query loop may both ask first
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._loop, name=self.label, daemon=True)
                self._thread.start()
        self._wanted.set()

    def stop(self) -> None:
        """Stop the thread, then run one last round in this thread (the query ended)."""
        with self._starting:
            self._stopping.set()
            thread, self._thread = self._thread, None
        if thread is not None:
            self._wanted.set()
            thread.join()
        self.run()

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping.is_set():
                return
            try:
                self.run()
            except REDIS_UNAVAILABLE as exc:  # expected now and then: one line, no traceback
                logger.warning(
                    "%s: Redis unavailable (%s); the next batch's round does its work",
                    self.label,
                    exc,
                )
            except Exception:  # the work stays: the next request does it
                logger.exception("%s failed; the next batch's round does its work", self.label)
