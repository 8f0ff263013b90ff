"""The monitor's memory between requests: stalls, replay rates, and the progress maths.

Pure logic over a clock, unit-tested without servers. Both trackers learn from the samples the
routes take anyway (every ``/health``, ``/metrics``, ``/lag`` call), see
:mod:`refold.services.monitor.status` for why no background sampler is needed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

__all__ = [
    "Progress",
    "RateTracker",
    "StallKey",
    "StallTracker",
    "replay_progress",
]

StallKey = tuple[str, int, str, int]  # processor, generation, topic, partition


@dataclass(slots=True)
class _Seen:
    position: int
    waiting_since: float | None  # None: nothing waited at the last sample
    observed: float


class StallTracker:
    """When did a partition's position last move while records waited on it?

    A partition is stalled when records wait on it (lag > 0) and its position has not moved
    for ``stall_after_s`` (Marten's ``maxSameLagTime``). Positions only grow, so one unchanged
    value between two samples means it did not move at all in between: sampling on demand
    never reports a stall that did not happen, it can only report it later (by one sampling
    interval). The waiting clock starts at the first sample that sees records waiting at the
    current position; a partition with nothing to do is never stalled, however long it idles.

    Thread-safe.

    Args:
        stall_after_s: How long a waiting partition may keep its position.
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(self, stall_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._seen: dict[StallKey, _Seen] = {}
        self._lock = threading.Lock()

    def observe(self, key: StallKey, position: int, lag_records: int) -> float | None:
        """Record one sample.

        Args:
            key: Processor, generation, topic, partition.
            position: Its applied position now.
            lag_records: Records waiting after it.

        Returns:
            Seconds its position has not moved while records waited; None when none wait.
        """
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if lag_records <= 0:
                self._seen[key] = _Seen(position, None, now)
                return None
            if seen is None or seen.position != position or seen.waiting_since is None:
                self._seen[key] = _Seen(position, now, now)
                return 0.0
            seen.observed = now
            return now - seen.waiting_since

    def is_stalled(self, waited_s: float | None) -> bool:
        """Whether an :meth:`observe` answer is a stall."""
        return waited_s is not None and waited_s >= self.stall_after_s

    def forget_older_than(self, age_s: float) -> None:
        """Drop partitions not sampled for ``age_s`` (generations that went away)."""
        now = self._clock()
        with self._lock:
            for key in [k for k, s in self._seen.items() if now - s.observed > age_s]:
                del self._seen[key]


class RateTracker:
    """Rate of a growing count (records applied per second) over a sliding window of samples.

    Thread-safe.

    Args:
        window_s: Samples older than this are dropped (the rate follows recent speed).
        min_span_s: Shortest span between the oldest and newest sample that gives a rate.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        window_s: float = 60.0,
        min_span_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._clock = clock
        self._samples: dict[Hashable, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def observe(self, key: Hashable, count: int) -> float | None:
        """Add a sample; the rate over the window (None until it spans ``min_span_s``)."""
        now = self._clock()
        with self._lock:
            samples = self._samples.setdefault(key, deque())
            if samples and count < samples[-1][1]:
                samples.clear()  # the count went back (a reset): start over
            samples.append((now, count))
            while len(samples) > 2 and now - samples[1][0] >= self.window_s:
                samples.popleft()  # keep one sample at or beyond the window's start
            first_at, first = samples[0]
            span = now - first_at
            return (count - first) / span if span >= self.min_span_s else None

    def forget_older_than(self, age_s: float) -> None:
        """Drop keys without a sample for ``age_s``."""
        now = self._clock()
        with self._lock:
            for key in [k for k, s in self._samples.items() if not s or now - s[-1][0] > age_s]:
                del self._samples[key]


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a generation being built is.

    Attributes:
        done: Records applied since it started (up to the log end).
        total: Records between its start and the log end now.
        percent: ``done / total`` in percent (100 when there is nothing to do).
        rate: Records applied per second, if known.
        eta_s: Seconds to the log end at that rate (0 when done; None when unknown).
    """

    done: int
    total: int
    percent: float
    rate: float | None
    eta_s: float | None

    @property
    def ratio(self) -> float:
        """``percent`` as a fraction in [0, 1]."""
        return self.percent / 100


def replay_progress(
    starting: Mapping[tuple[str, int], int],
    positions: Mapping[tuple[str, int], int],
    ends: Mapping[tuple[str, int], int],
    rate: float | None,
) -> Progress:
    """Progress of a generation from where it started to the log end (pure).

    Args:
        starting: Where it started per partition (absent: offset 0).
        positions: What it has applied per partition (absent: its start).
        ends: The log end per partition: the partitions that count.
        rate: Records applied per second (None: unknown).

    Returns:
        Done, total, percent, rate and ETA.
    """
    done = total = 0
    for tp, end in ends.items():
        start = min(starting.get(tp, 0), end)
        total += end - start
        done += max(0, min(positions.get(tp, start), end) - start)
    percent = 100.0 if total == 0 else round(100.0 * done / total, 2)
    remaining = total - done
    if remaining <= 0:
        eta: float | None = 0.0
    elif rate is not None and rate > 0:
        eta = round(remaining / rate, 1)
    else:
        eta = None
    return Progress(done, total, percent, rate, eta)
