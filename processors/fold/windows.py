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
    "BucketCell",
    "Hopping",
    "Measure",
    "Sliding",
    "Tumbling",
    "Window",
    "WindowCells",
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
    if not scales:  # integers only: to_units checked them and keeps each as it is
        return measure
    return Measure(measure.group, values, measure.distinct)


@dataclass(slots=True)
class BucketCell:
    """Events of one group, aggregated: their count, and per measure sum, low, high, values.

    Attributes:
        count: How many events.
        sums: Per measure, the sum of its values.
        lows: Per measure, the smallest value.
        highs: Per measure, the largest value.
        distinct: Per distinct measure, the values seen.
    """

    count: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    lows: dict[str, int] = field(default_factory=dict)
    highs: dict[str, int] = field(default_factory=dict)
    distinct: dict[str, set[str]] = field(default_factory=dict)

    def add(self, measure: Measure) -> None:
        """One more event's measure."""
        self.count += 1
        sums, lows, highs = self.sums, self.lows, self.highs
        for name, value in measure.values.items():
            if name in sums:
                sums[name] += value
                if value < lows[name]:
                    lows[name] = value
                elif value > highs[name]:
                    highs[name] = value
            else:
                sums[name] = lows[name] = highs[name] = value
        for name, member in measure.distinct.items():
            seen = self.distinct.get(name)
            if seen is None:
                self.distinct[name] = {member}
            else:
                seen.add(member)

    def merge(self, other: BucketCell) -> None:
        """Add ``other``'s events."""
        self.count += other.count
        sums, lows, highs = self.sums, self.lows, self.highs
        for name, total in other.sums.items():
            if name in sums:
                sums[name] += total
                lows[name] = min(lows[name], other.lows[name])
                highs[name] = max(highs[name], other.highs[name])
            else:
                sums[name], lows[name], highs[name] = total, other.lows[name], other.highs[name]
        for name, members in other.distinct.items():
            self.distinct.setdefault(name, set()).update(members)

    def copy(self) -> BucketCell:
        """A copy that merges without changing this one."""
        return BucketCell(
            self.count,
            dict(self.sums),
            dict(self.lows),
            dict(self.highs),
            {name: set(members) for name, members in self.distinct.items()},
        )


_Bucket = tuple[str, int, str]  # (window, start, group)


@dataclass(slots=True)
class WindowDelta:
    """What one transaction adds to the window buckets, and the timers it sets.

    Attributes:
        buckets: Per bucket ``(window, start, group)``: what its events add.
        closes: Close timers ``member -> window end``.
        expiries: Expiry timers ``member -> last end + retention``.
    """

    buckets: dict[_Bucket, BucketCell] = field(default_factory=dict)
    closes: dict[bytes, int] = field(default_factory=dict)
    expiries: dict[bytes, int] = field(default_factory=dict)
    # The buckets whose cell is their own (the others share theirs, and copy it to add more).
    _owned: set[_Bucket] = field(default_factory=set, repr=False, compare=False)

    @property
    def adds(self) -> dict[_Bucket, Counter[str]]:
        """Per bucket: increments of ``count`` and ``sum:<m>``."""
        return {
            b: Counter({"count": c.count, **{f"sum:{n}": v for n, v in c.sums.items()}})
            for b, c in self.buckets.items()
        }

    @property
    def lows(self) -> dict[tuple[str, int, str, str], int]:
        """Per ``(window, start, group, "min:<m>")``: the smallest value seen."""
        return {(*b, f"min:{n}"): v for b, c in self.buckets.items() for n, v in c.lows.items()}

    @property
    def highs(self) -> dict[tuple[str, int, str, str], int]:
        """Per ``(window, start, group, "max:<m>")``: the largest value seen."""
        return {(*b, f"max:{n}"): v for b, c in self.buckets.items() for n, v in c.highs.items()}

    @property
    def distinct(self) -> dict[tuple[str, str, int, str], set[str]]:
        """Per ``(window, measure, start, group)``: distinct values seen."""
        return {
            (w, n, s, g): members
            for (w, s, g), c in self.buckets.items()
            for n, members in c.distinct.items()
        }

    def add(self, windows: Iterable[Window], at: int, measure: Measure, retention_ms: int) -> None:
        """Add one event (event time ``at``) to every bucket of ``windows`` it falls in."""
        cell = BucketCell()
        cell.add(measure)
        for window in windows:
            self.add_cell(window, at, measure.group, cell, retention_ms)

    def add_cell(
        self, window: Window, at: int, group: str, cell: BucketCell, retention_ms: int
    ) -> None:
        """Add ``cell`` (events at ``at``, or in its step of ``window``'s grid) to its buckets.

        ``cell`` is shared, not copied, until another adds to the same bucket: it must not
        change afterwards.
        """
        buckets, name = self.buckets, window.name
        for start in window.starts(at):
            bucket = (name, start, group)
            held = buckets.get(bucket)
            if held is None:
                buckets[bucket] = cell
                ends = window.ends(start)
                for end in ends if window.emit else ():
                    self.closes[encode_timer(name, end, group)] = end
                self.expiries[encode_timer(name, start, group)] = ends[-1] + retention_ms
                continue
            if bucket not in self._owned:
                held = buckets[bucket] = held.copy()
                self._owned.add(bucket)
            held.merge(cell)


class WindowCells:
    """A batch's measures aggregated per group and step of the windows' grids, then bucketed.

    An event adds to every bucket of every window it falls in: five for five minutes hopping
    by one. Events of one group in the same step of a window's grid (``grid_ms``: a minute
    there) add to the same buckets, so a batch first adds each event to one cell per distinct
    grid, and :meth:`delta` adds each cell to its buckets once. The result is the
    :class:`WindowDelta` that adding every event to it would make (the oracle does so).
    """

    def __init__(self, windows: Iterable[Window]) -> None:
        self.windows = tuple(windows)
        self.grids = tuple(sorted({w.grid_ms for w in self.windows}))
        self.cells: dict[tuple[int, int, str], BucketCell] = {}

    def add(self, at: int, measure: Measure) -> None:
        """One event (event time ``at``)."""
        cells, group = self.cells, measure.group
        for grid in self.grids:
            key = (grid, at - at % grid, group)
            cell = cells.get(key)
            if cell is None:
                cell = cells[key] = BucketCell()
            cell.add(measure)

    def delta(self, retention_ms: int) -> WindowDelta:
        """What the events add to the buckets, and the timers they set."""
        on_grid = {g: [w for w in self.windows if w.grid_ms == g] for g in self.grids}
        delta = WindowDelta()
        for (grid, at, group), cell in self.cells.items():
            for window in on_grid[grid]:
                delta.add_cell(window, at, group, cell, retention_ms)
        return delta
