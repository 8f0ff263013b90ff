"""Scheduling deliveries: attempts at their due times, the window of uncommitted records, progress.

:class:`AttemptScheduler` runs attempts in a thread pool, at most ``limit`` at a time, each when
it is due (at once, or after its backoff): an insight waiting for a retry holds no thread and no
connection, so one slow or failing insight does not hold up the others.

:class:`UncommittedWindow` keeps the records read and not yet committed, per partition in
offset order. A partition's position may only move past records that are settled (delivered
or dead-lettered), so :meth:`UncommittedWindow.pop_settled` takes each partition's settled
*prefix*; records settled behind an unsettled one wait for it. A crash re-delivers at most the
window.

:class:`ProgressReport` decides when the loop logs a progress line: at most once a period, and
only when records were settled since the last one (an idle dispatcher writes nothing).

All are driven by the dispatcher's loop thread only (not thread-safe).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from refold.services.webhooks.delivery import AttemptResult
from refold.services.webhooks.items import DeliveryItem

__all__ = ["AttemptScheduler", "ProgressReport", "UncommittedWindow"]

TP = tuple[str, int]


class AttemptScheduler:
    """Attempts items when due, at most ``limit`` in flight.

    Args:
        pool: The worker threads (at least ``limit``).
        attempt: Makes one attempt (runs in a worker thread; must not raise).
        settle: Records a result (loop thread); returns the delay before the next attempt, or
            ``None`` when the item needs none (settled, or left for the next run).
        limit: Attempts in flight at most.
    """

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        attempt: Callable[[DeliveryItem], AttemptResult],
        settle: Callable[[DeliveryItem, AttemptResult], float | None],
        limit: int,
    ) -> None:
        self._pool = pool
        self._attempt = attempt
        self._settle = settle
        self._limit = limit
        self._due: list[tuple[float, int, DeliveryItem]] = []
        self._sequence = itertools.count()
        self._in_flight: dict[Future[AttemptResult], DeliveryItem] = {}

    @property
    def busy(self) -> bool:
        """True while some item waits for an attempt or for its answer."""
        return bool(self._due or self._in_flight)

    @property
    def pending(self) -> int:
        """Items waiting for an attempt or for its answer."""
        return len(self._due) + len(self._in_flight)

    def add(self, item: DeliveryItem, delay: float = 0.0) -> None:
        """Schedule an attempt of ``item`` after ``delay`` seconds."""
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._sequence), item))

    def step(self, max_wait: float, stop: threading.Event) -> int:
        """Start the due attempts, then wait up to ``max_wait`` for answers; settle them.

        Returns early on an answer or on ``stop``. Wakes for the next due item only when a slot
        is free for it (waiting for zero seconds here would spin and starve the workers).

        Returns:
            How many answers were settled.
        """
        now = time.monotonic()
        while self._due and self._due[0][0] <= now and len(self._in_flight) < self._limit:
            item = heapq.heappop(self._due)[2]
            self._in_flight[self._pool.submit(self._attempt, item)] = item
        timeout = max_wait
        if self._due and len(self._in_flight) < self._limit:
            timeout = min(timeout, max(0.0, self._due[0][0] - now))
        if not self._in_flight:
            stop.wait(timeout)
            return 0
        finished, _ = wait(self._in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        for future in finished:
            item = self._in_flight.pop(future)
            delay = self._settle(item, future.result())
            if delay is not None:
                self.add(item, delay)
        return len(finished)

    def drain(self) -> None:
        """Stopping: let the attempts in flight finish and settle them; start no new ones."""
        for future, item in list(self._in_flight.items()):
            self._settle(item, future.result())
        self._in_flight.clear()
        self._due.clear()


class UncommittedWindow:
    """Records read and not committed yet, per partition in offset order."""

    def __init__(self) -> None:
        self._partitions: dict[TP, deque[DeliveryItem]] = {}
        self.size = 0

    def add(self, item: DeliveryItem) -> None:
        """Append a record just read (records of a partition arrive in offset order)."""
        tp = (item.read_topic, item.read_partition)
        self._partitions.setdefault(tp, deque()).append(item)
        self.size += 1

    def committable(self) -> bool:
        """True when some partition's oldest record is settled (a prefix can be popped)."""
        return any(q and q[0].final is not None for q in self._partitions.values())

    def holds(self, tp: TP) -> bool:
        """True when a record of ``tp`` was read and is not committed yet."""
        return bool(self._partitions.get(tp))

    def pop_settled(self) -> tuple[dict[TP, int], list[DeliveryItem]]:
        """Take every partition's settled prefix.

        Returns:
            The next offset to store per partition that moved, and the records taken.
        """
        positions: dict[TP, int] = {}
        taken: list[DeliveryItem] = []
        for tp, queue in self._partitions.items():
            while queue and queue[0].final is not None:
                item = queue.popleft()
                taken.append(item)
                positions[tp] = item.read_offset + 1
        self.size -= len(taken)
        return positions, taken


class ProgressReport:
    """When the dispatcher logs its progress: once a period at most, never while idle.

    An idle dispatcher used to log "delivered 5 (0/s)" every 10 s: 39 of a log's 214 lines.

    Args:
        period_s: The shortest time between two lines.
        now: The loop's clock at start (``time.monotonic()``).
    """

    def __init__(self, period_s: float, now: float) -> None:
        self.period_s = period_s
        self._since = now
        self._settled = 0
        self._delivered = 0

    def due(self, delivered: int, settled: int, now: float) -> float | None:
        """Whether a line is due; if so, the delivery rate (per second) since the last check.

        Args:
            delivered: Records delivered so far (a running total).
            settled: Records settled so far, whatever the outcome (delivered, retried,
                dead-lettered): a running total.
            now: The loop's clock.

        Returns:
            The rate to report, or ``None``: no line (too soon, or nothing happened).
        """
        if now - self._since < self.period_s:
            return None
        rate = (delivered - self._delivered) / (now - self._since)
        active = settled != self._settled
        self._since, self._settled, self._delivered = now, settled, delivered
        return rate if active else None
