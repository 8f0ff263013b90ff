"""Driver-side work that runs beside the next micro-batch: window closing, table lookups.

A processor query's ``foreachBatch`` asks for a round (:meth:`DriverTask.request`) after each
micro-batch; the round runs in a background thread while Spark plans and runs the next batch.
The rounds only read committed state and change Redis in guarded steps of their own (a timer
is settled, a lookup applied, exactly once), so they need no lock with the batches. A failed
round is logged and its work stays where it was: the next round does it.
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

    def __init__(self) -> None:
        self.done = 0
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported = 0

    @abstractmethod
    def run(self) -> int:
        """One round; returns how many things it did (windows emitted, events joined)."""

    def request(self) -> int:
        """Ask for a round (after a batch); how many things were done since last asked."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.label, daemon=True)
            self._thread.start()
        self._wanted.set()
        done, self._reported = self.done - self._reported, self.done
        return done

    def stop(self) -> None:
        """Stop the thread, then run one last round in this thread (the query ended)."""
        if self._thread is not None:
            self._stopping.set()
            self._wanted.set()
            self._thread.join()
            self._thread = None
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
