"""What the broker says about the logs a monitor watches: partitions, ends, record timestamps.

Dashboards poll every few seconds, Prometheus scrapes, load balancers probe ``/health``: all of
them ask for the same few partitions. :class:`LogProbe` answers them from a cache and asks the
broker at most once per partition per ``ttl_s`` (ends) or once per offset ever (the timestamp
of the record at an offset never changes), from one worker thread. A caller never waits longer
than its own deadline: what the broker has not answered by then is missing from the answer
(metrics without lag, ``null`` lag in JSON), never a hung request; after a failure the broker
is left alone for ``backoff_s``, answering from the cache meanwhile.

Lifecycle: one per app, thread-safe. The worker thread is started on first demand and exits
after a minute without any, so an app that is dropped leaves no thread behind for long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from refold.contracts.kafka.offsets import LogOffsets, OffsetsError

__all__ = ["LogProbe", "StampKey", "TopicPartition"]

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
StampKey = tuple[str, int, int]  # topic, partition, offset

# Timestamps kept (one per partition and position asked): a few thousand partitions' worth.
_STAMPS_KEPT = 10_000
# The worker exits after this long without demand (started again by the next caller).
_IDLE_EXIT_S = 60.0


@dataclass(slots=True)
class _Round:
    """What the worker is asked to measure next."""

    topics: set[str] = field(default_factory=set)
    stamps: set[StampKey] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.topics or self.stamps)


class LogProbe:
    """Cached, time-bounded answers about partitions, log ends and record timestamps.

    Args:
        offsets: Lends the app's :class:`LogOffsets` (``ServiceContext.offsets``).
        ttl_s: How long an end is reused before the broker is asked again.
        max_age_s: The oldest end still given when the broker does not answer in time.
        partitions_ttl_s: How long a topic's partition list is reused.
        backoff_s: How long the broker is left alone after it failed.
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        offsets: Callable[[], AbstractContextManager[LogOffsets]],
        *,
        ttl_s: float = 1.0,
        max_age_s: float = 10.0,
        partitions_ttl_s: float = 30.0,
        backoff_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._offsets = offsets
        self.ttl_s = ttl_s
        self.max_age_s = max_age_s
        self.partitions_ttl_s = partitions_ttl_s
        self.backoff_s = backoff_s
        self._clock = clock
        self._cond = threading.Condition()
        self._partitions: dict[str, tuple[float, tuple[int, ...]]] = {}
        self._ends: dict[TopicPartition, tuple[float, int]] = {}
        self._stamps: OrderedDict[StampKey, int] = OrderedDict()
        self._no_record: dict[StampKey, float] = {}
        self._absent: dict[str, float] = {}
        self._wanted = _Round()
        self._failed_at: float | None = None
        self.last_error: str | None = None
        self._worker: threading.Thread | None = None
        self._closed = False

    # -- callers ------------------------------------------------------------------------

    def ends(
        self, topics: Iterable[str], deadline: float
    ) -> tuple[dict[str, tuple[int, ...]], dict[TopicPartition, int]]:
        """Partitions of ``topics`` and their log ends, as known by ``deadline``.

        Args:
            topics: Topic names.
            deadline: ``clock()`` time by which to answer.

        Returns:
            ``(partitions per topic, end per partition)``; a topic the broker says does not
            exist has no partitions; a topic or partition the broker did not answer for in
            time (and that is not cached recently enough) is missing.
        """
        wanted = sorted(set(topics))
        with self._cond:
            asked = self._clock()
            stale = [t for t in wanted if not self._fresh_topic(t, asked)]
            if stale and self._ask(_Round(topics=set(stale))):
                while stale and self._clock() < deadline and not self._failed_since(asked):
                    self._cond.wait(max(0.0, deadline - self._clock()))
                    stale = [t for t in stale if not self._fresh_topic(t, asked)]
            now = self._clock()
            parts: dict[str, tuple[int, ...]] = {}
            ends: dict[TopicPartition, int] = {}
            for topic in wanted:
                absent = self._absent.get(topic)
                if absent is not None and now - absent <= self.max_age_s:
                    parts[topic] = ()  # no such topic: nothing waits on it
                    continue
                entry = self._partitions.get(topic)
                if entry is None:
                    continue
                parts[topic] = entry[1]
                for partition in entry[1]:
                    found = self._ends.get((topic, partition))
                    if found is not None and now - found[0] <= self.max_age_s:
                        ends[topic, partition] = found[1]
        return parts, ends

    def timestamps(self, wanted: Iterable[StampKey], deadline: float) -> dict[StampKey, int | None]:
        """Timestamp (ms) of the first record at or after each ``(topic, partition, offset)``.

        Args:
            wanted: What to look up.
            deadline: ``clock()`` time by which to answer.

        Returns:
            Per key answered in time: the timestamp, or None when no record is there (yet).
        """
        keys = sorted(set(wanted))
        with self._cond:
            asked = self._clock()
            missing = [k for k in keys if not self._known_stamp(k, asked)]
            if missing and self._ask(_Round(stamps=set(missing))):
                while missing and self._clock() < deadline and not self._failed_since(asked):
                    self._cond.wait(max(0.0, deadline - self._clock()))
                    missing = [k for k in missing if not self._known_stamp(k, asked)]
            found: dict[StampKey, int | None] = {}
            for key in keys:
                if key in self._stamps:
                    found[key] = self._stamps[key]
                elif self._known_stamp(key, asked):
                    found[key] = None
        return found

    @property
    def healthy(self) -> bool:
        """False while the broker is in its back-off after a failure."""
        with self._cond:
            return not self._backing_off(self._clock())

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- under the lock -------------------------------------------------------------------

    def _fresh_topic(self, topic: str, now: float) -> bool:
        absent = self._absent.get(topic)
        if absent is not None and now - absent <= self.ttl_s:
            return True  # the broker said it does not exist: nothing to wait for
        entry = self._partitions.get(topic)
        if entry is None or now - entry[0] > self.partitions_ttl_s:
            return False
        for partition in entry[1]:
            end = self._ends.get((topic, partition))
            if end is None or now - end[0] > self.ttl_s:
                return False
        return True

    def _known_stamp(self, key: StampKey, now: float) -> bool:
        if key in self._stamps:
            return True
        at = self._no_record.get(key)
        return at is not None and now - at <= self.ttl_s

    def _backing_off(self, now: float) -> bool:
        return self._failed_at is not None and now - self._failed_at < self.backoff_s

    def _failed_since(self, asked: float) -> bool:
        return self._failed_at is not None and self._failed_at >= asked

    def _ask(self, more: _Round) -> bool:
        """Queue ``more`` for the worker; False when the broker is backed off (cache only)."""
        if self._closed or self._backing_off(self._clock()):
            return False
        self._wanted.topics |= more.topics
        self._wanted.stamps |= more.stamps
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._loop, name="refold-log-probe", daemon=True)
            self._worker.start()
        self._cond.notify_all()
        return True

    # -- the worker -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                idle_since = self._clock()
                while not self._wanted and not self._closed:
                    if self._clock() - idle_since > _IDLE_EXIT_S:
                        self._worker = None
                        return
                    self._cond.wait(1.0)
                if self._closed:
                    return
                work, self._wanted = self._wanted, _Round()
            try:
                self._measure(work)
            except Exception as exc:  # the broker's failure, whatever its kind, is an answer
                logger.warning("log probe failed: %s", exc)
                with self._cond:
                    self._failed_at = self._clock()
                    self.last_error = str(exc)
                    self._wanted = _Round()  # the failure answers what was asked meanwhile
                    self._cond.notify_all()

    def _measure(self, work: _Round) -> None:
        """Ask the broker (outside the lock); store each answer as soon as it arrives."""
        with self._offsets() as offsets:
            if work.topics:
                self._measure_ends(offsets, sorted(work.topics))
            for key in sorted(work.stamps):
                found = offsets.record_timestamp(*key)
                with self._cond:
                    if found is None:
                        self._no_record[key] = self._clock()
                    else:
                        self._stamps[key] = found[0]
                        while len(self._stamps) > _STAMPS_KEPT:
                            self._stamps.popitem(last=False)
                    self._cond.notify_all()

    def _measure_ends(self, offsets: LogOffsets, topics: list[str]) -> None:
        with self._cond:
            now = self._clock()
            parts = {
                t: entry[1]
                for t in topics
                if (entry := self._partitions.get(t)) is not None
                and now - entry[0] <= self.partitions_ttl_s
            }
        absent = []
        for topic in topics:
            if topic in parts:
                continue
            try:
                parts[topic] = tuple(offsets.partitions(topic))
            except OffsetsError as exc:
                if exc.__cause__ is not None:  # the broker failed, not the topic
                    raise
                absent.append(topic)  # it does not exist (yet): no lag to tell
        tps = [(t, p) for t, known in parts.items() for p in known]
        ends = offsets.end_offsets(tps)
        with self._cond:
            at = self._clock()
            for topic in absent:
                self._absent[topic] = at
                self._partitions.pop(topic, None)
            for topic, known in parts.items():
                self._absent.pop(topic, None)
                self._partitions[topic] = (at, known)
            self._ends.update({tp: (at, end) for tp, end in ends.items()})
            self._cond.notify_all()
