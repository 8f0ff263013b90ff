"""Window processors: what an event counts for, and what one transaction adds to the buckets.

Pure. A window processor (:class:`WindowFold`) says, per event, which group it counts in and
which values it measures (:class:`Measure`); the platform adds it to the buckets of every
window it declares (the shapes: :mod:`refold.contracts.windows`). Buckets are additive (counts and
sums add, minimum and maximum combine in any order, distinct values go to a HyperLogLog, where
PFADD is idempotent), so several partitions' tasks add to one bucket, each under its own
partition's guard, and a window keyed independently of the partition key (sales per currency)
needs no re-partitioning.

Every window emits its result once when the processor's watermark passes its end (see
:class:`refold.processors.runtime.window_store.WindowCloser`); its buckets expire ``retention_ms``
after that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from refold.contracts.windows import (
    CLOSE_TIMERS,
    EXPIRE_TIMERS,
    Hopping,
    Sliding,
    Tumbling,
    Window,
    combine,
    decode_timer,
    encode_timer,
    result_of,
    scales_of,
    to_units,
    windows_topic,
)
from refold.processors.fold.projection import EventRejectedError

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
    "scaled",
    "scales_of",
    "windows_topic",
]


@dataclass(frozen=True, slots=True)
class Measure:
    """What one event counts for: its group, its values and its distinct keys.

    Attributes:
        group: The bucket group (e.g. the currency); any string.
        values: Values to sum, and keep the minimum and maximum of: integers (money in minor
            units), or decimals (``Decimal``, ``float`` or ``int``) for the measures the fold
            declares in its ``scales``.
        distinct: Per distinct measure, the value whose distinct count is wanted (HyperLogLog).
    """

    group: str
    values: Mapping[str, int] = field(default_factory=dict)
    distinct: Mapping[str, str] = field(default_factory=dict)


class WindowFold(Protocol):
    """A processor that counts events into windows (instead of folding entity states).

    Implementations must be picklable and deterministic. The platform decides lateness (from
    the spec's :class:`~refold.contracts.processors.EventTime`), adds each on-time event to its
    buckets, closes windows on the watermark and expires them after the retention.

    A fold may also declare ``scales``: ``{measure: digits after the point}`` for the measures
    that are decimals (``scales = {"celsius": 2}``). Their values are stored exactly as integers
    of ``10**-scale`` units and reported as ``Decimal`` (see :mod:`refold.contracts.windows`); every
    other measure is an integer.
    """

    @property
    def name(self) -> str:
        """Processor name."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types it counts; the other types on its topics are passed by."""
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


def scaled(measure: Measure, scales: Mapping[str, int]) -> Measure:
    """``measure`` with every value as the integer its buckets hold (see ``scales``).

    Raises:
        EventRejectedError: A value is not a number of its measure's kind (the record goes to
            the dead letters with this reason).
    """
    try:
        values = {name: to_units(name, v, scales.get(name)) for name, v in measure.values.items()}
    except ValueError as exc:
        raise EventRejectedError(str(exc)) from None
    return Measure(measure.group, values, measure.distinct)


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
                    for end in ends if window.emit else ():
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
