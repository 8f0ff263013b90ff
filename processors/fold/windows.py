"""Windows on event time: declarations, the buckets an event adds to, and window results.

Pure. A window processor (:class:`WindowFold`) says, per event, which group it counts in and
which values it measures (:class:`Measure`); the platform adds it to the buckets of every
window it declares. Buckets are additive (counts and sums add, minimum and maximum combine in
any order, distinct values go to a HyperLogLog, where PFADD is idempotent), so several
partitions' tasks add to one bucket, each under its own partition's guard, and a window keyed
independently of the partition key (sales per currency) needs no re-partitioning.

- :class:`Tumbling`: fixed, non-overlapping windows; one bucket per window.
- :class:`Hopping`: windows of ``size`` starting every ``hop``; an event adds to each of the
  ``size / hop`` windows that contain it (writes multiply, reads are one bucket).
- :class:`Sliding`: windows of ``size`` ending every ``step``, computed from fine buckets of
  ``step``: an event adds to one fine bucket, and a window's result is its fine buckets
  combined; the closer moves from one window to the next incrementally, adding the newest fine
  bucket and subtracting the one that left (seed 001).

Every window emits its result once when the processor's watermark passes its end (see
:mod:`processors.runtime.closer`); its buckets expire ``retention_ms`` after that.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from contracts.errors import ContractError

__all__ = [
    "CLOSE_TIMERS",
    "EXPIRE_TIMERS",
    "Hopping",
    "Measure",
    "Sliding",
    "Tumbling",
    "Window",
    "WindowDelta",
    "WindowFold",
    "combine",
    "decode_timer",
    "encode_timer",
    "result_of",
    "windows_topic",
]

CLOSE_TIMERS = "close"  # member [window, end, group] -> end: the window's result is due
EXPIRE_TIMERS = "expire"  # member [window, start, group] -> last end + retention: delete bucket
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def windows_topic(processor: str) -> str:
    """The topic a processor's closed windows are emitted to."""
    return f"{processor}.windows"


def _check(name: str, size_ms: int, every_ms: int, what: str) -> None:
    problems = []
    if not _NAME.match(name):
        problems.append("the name must be lower case letters, digits and _")
    if size_ms <= 0 or every_ms <= 0:
        problems.append("sizes must be positive")
    elif size_ms % every_ms:
        problems.append(f"size_ms must be a multiple of {what}")
    if problems:
        msg = f"window {name!r}: {'; '.join(problems)}"
        raise ContractError(msg)


@dataclass(frozen=True, slots=True)
class Tumbling:
    """Fixed windows ``[k*size, (k+1)*size)``."""

    name: str
    size_ms: int

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.size_ms, "itself")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored bucket."""
        return self.size_ms

    def starts(self, at: int) -> list[int]:
        """The starts of the buckets an event at ``at`` adds to."""
        return [at - at % self.size_ms]

    def ends(self, start: int) -> list[int]:
        """The ends of the windows bucket ``start`` is part of."""
        return [start + self.size_ms]

    def bucket_starts(self, end: int) -> list[int]:
        """The buckets that make up the window ending at ``end``."""
        return [end - self.size_ms]


@dataclass(frozen=True, slots=True)
class Hopping:
    """Windows of ``size_ms`` starting every ``hop_ms``; each is its own bucket."""

    name: str
    size_ms: int
    hop_ms: int

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.hop_ms, "hop_ms")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored bucket (a whole window)."""
        return self.size_ms

    def starts(self, at: int) -> list[int]:
        """Every window start ``s`` with ``s <= at < s + size`` (newest first)."""
        last = at - at % self.hop_ms
        return [last - i * self.hop_ms for i in range(self.size_ms // self.hop_ms)]

    def ends(self, start: int) -> list[int]:
        """The end of the window starting at ``start``."""
        return [start + self.size_ms]

    def bucket_starts(self, end: int) -> list[int]:
        """The window ending at ``end`` is one bucket."""
        return [end - self.size_ms]


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``size_ms`` ending every ``step_ms``, made of fine buckets of ``step_ms``."""

    name: str
    size_ms: int
    step_ms: int

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.step_ms, "step_ms")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored (fine) bucket."""
        return self.step_ms

    def starts(self, at: int) -> list[int]:
        """The one fine bucket an event adds to."""
        return [at - at % self.step_ms]

    def ends(self, start: int) -> list[int]:
        """The ends of every window that contains fine bucket ``start``."""
        return [start + self.step_ms * (i + 1) for i in range(self.size_ms // self.step_ms)]

    def bucket_starts(self, end: int) -> list[int]:
        """The fine buckets of the window ending at ``end``, oldest first."""
        return list(range(end - self.size_ms, end, self.step_ms))


Window = Tumbling | Hopping | Sliding


@dataclass(frozen=True, slots=True)
class Measure:
    """What one event counts for: its group, its values and its distinct keys.

    Attributes:
        group: The bucket group (e.g. the currency); any string.
        values: Integer values to sum, and keep the minimum and maximum of (money in minor
            units).
        distinct: Per distinct measure, the value whose distinct count is wanted (HyperLogLog).
    """

    group: str
    values: Mapping[str, int] = field(default_factory=dict)
    distinct: Mapping[str, str] = field(default_factory=dict)


class WindowFold(Protocol):
    """A processor that counts events into windows (instead of folding entity states).

    Implementations must be picklable and deterministic. The platform decides lateness (from
    the spec's :class:`~contracts.processors.EventTime`), adds each on-time event to its
    buckets, closes windows on the watermark and expires them after the retention.
    """

    @property
    def name(self) -> str:
        """Processor name."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types it counts; others are dead-lettered."""
        ...

    @property
    def windows(self) -> tuple[Window, ...]:
        """The windows every measure is added to."""
        ...

    @property
    def distinct(self) -> tuple[str, ...]:
        """The distinct measures its :class:`Measure` s may name (read back and expired)."""
        ...

    def measure(self, event_type: str, event: Mapping[str, Any]) -> Iterable[Measure]:
        """What the event counts for (nothing: it counts nowhere).

        Raises:
            EventRejectedError: The event is not valid (it goes to the dead letters).
        """
        ...


def encode_timer(window: str, at: int, group: str) -> bytes:
    """A timer member: window, time (an end or a start) and group."""
    return orjson.dumps([window, at, group])


def decode_timer(member: bytes | str) -> tuple[str, int, str]:
    """Inverse of :func:`encode_timer`."""
    window, at, group = orjson.loads(member)
    return str(window), int(at), str(group)


@dataclass(slots=True)
class WindowDelta:
    """What one transaction adds to the window buckets, and the timers it sets.

    Attributes:
        adds: Per bucket ``(window, start, group)``: increments of ``count`` and ``sum:<m>``.
        lows: Per ``(window, start, group, "min:<m>")``: the smallest value seen.
        highs: Per ``(window, start, group, "max:<m>")``: the largest value seen.
        distinct: Per ``(window, measure, start, group)``: distinct values seen.
        closes: Close timers ``member -> window end``.
        expiries: Expiry timers ``member -> last end + retention``.
    """

    adds: dict[tuple[str, int, str], Counter[str]] = field(default_factory=dict)
    lows: dict[tuple[str, int, str, str], int] = field(default_factory=dict)
    highs: dict[tuple[str, int, str, str], int] = field(default_factory=dict)
    distinct: dict[tuple[str, str, int, str], set[str]] = field(default_factory=dict)
    closes: dict[bytes, int] = field(default_factory=dict)
    expiries: dict[bytes, int] = field(default_factory=dict)

    def add(self, windows: Iterable[Window], at: int, measure: Measure, retention_ms: int) -> None:
        """Add one event (event time ``at``) to every bucket of ``windows`` it falls in."""
        group = measure.group
        for window in windows:
            for start in window.starts(at):
                bucket = (window.name, start, group)
                counts = self.adds.get(bucket)
                if counts is None:
                    counts = self.adds[bucket] = Counter()
                    ends = window.ends(start)
                    for end in ends:
                        self.closes[encode_timer(window.name, end, group)] = end
                    self.expiries[encode_timer(window.name, start, group)] = ends[-1] + retention_ms
                counts["count"] += 1
                for name, value in measure.values.items():
                    counts[f"sum:{name}"] += value
                    low, high = (*bucket, f"min:{name}"), (*bucket, f"max:{name}")
                    self.lows[low] = min(self.lows.get(low, value), value)
                    self.highs[high] = max(self.highs.get(high, value), value)
                for name, member in measure.distinct.items():
                    self.distinct.setdefault((window.name, name, start, group), set()).add(member)

    def __bool__(self) -> bool:
        return bool(self.adds)


def combine(buckets: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Several buckets' aggregates as one: counts and sums add, minimum and maximum combine."""
    out: dict[str, int] = {}
    for bucket in buckets:
        for name, value in bucket.items():
            current = out.get(name)
            if current is None:
                out[name] = value
            elif name.startswith("min:"):
                out[name] = min(current, value)
            elif name.startswith("max:"):
                out[name] = max(current, value)
            else:
                out[name] = current + value
    return out


def result_of(
    window: Window,
    end: int,
    group: str,
    aggregates: Mapping[str, int],
    distinct: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A window's result as emitted and read: aggregates, averages and distinct counts.

    ``avg:<m>`` is ``sum:<m> / count`` (a float); distinct counts are HyperLogLog estimates.
    """
    count = aggregates.get("count", 0)
    if not count:  # an emptied sliding window: nothing but its count
        aggregates, distinct = {"count": 0}, {}
    averages = {
        f"avg:{name[4:]}": value / count
        for name, value in aggregates.items()
        if name.startswith("sum:") and count
    }
    return {
        "window": window.name,
        "group": group,
        "start": end - window.size_ms,
        "end": end,
        **dict(sorted(aggregates.items())),
        **averages,
        **{f"distinct:{k}": v for k, v in sorted((distinct or {}).items())},
    }
