"""Window shapes on event time: which buckets an event adds to, and a window's result.

Pure, and shared by the processors that write windows and by the readers (so a reader never
imports processor code). The fold side (what an event counts for, the per-transaction delta) is
in :mod:`refold.processors.fold.windows`.

- :class:`Tumbling`: fixed, non-overlapping windows; one bucket per window.
- :class:`Hopping`: windows of ``size`` starting every ``hop``; an event adds to each of the
  ``size / hop`` windows that contain it (writes multiply, reads are one bucket).
- :class:`Sliding`: windows of ``size`` ending every ``step``, made of fine buckets of
  ``step``: an event adds to one fine bucket, and a window's result is its fine buckets
  combined; the closer moves from one window to the next incrementally, adding the newest fine
  bucket and subtracting the one that left (seed 001).

Each window emits its result when the watermark passes its end unless declared with
``emit=False`` (then it is only read, e.g. a sliding "last five minutes" read on demand: no
close timers, no emission, the same buckets).

Buckets hold ``count`` and, per measured value ``m``, ``sum:m``, ``min:m`` and ``max:m``
(integers); distinct values go to a HyperLogLog per bucket. :func:`result_of` is the shape a
window's result is emitted and read in.

A measure may be a decimal with a declared scale (a fold's ``scales``, e.g. ``{"celsius": 2}``):
its values are stored as integers of ``10**-scale`` units (:func:`to_units`, rounded half to
even), so sums stay exact and do not depend on the order of the additions (a replay adds in
another order than the live run), and are reported back as :class:`~decimal.Decimal` in the
user's units (:func:`from_units`). Plain float sums are not offered: float addition is not
associative, so the same events added in another order (another partition interleaving, a
replay) could give another sum, and live state would not equal its replay.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation, localcontext
from typing import Any

import orjson

from refold.contracts.catalog import SCHEMA_ROOT
from refold.contracts.errors import ContractError
from refold.contracts.registry import ContractSet

__all__ = [
    "CLOSE_TIMERS",
    "EXPIRE_TIMERS",
    "WINDOW_RESULT",
    "WINDOW_RESULTS",
    "Hopping",
    "Sliding",
    "Tumbling",
    "Window",
    "combine",
    "decode_timer",
    "encode_timer",
    "from_units",
    "result_from_record",
    "result_of",
    "result_record",
    "scales_from_meta",
    "scales_of",
    "to_units",
    "watermark_of",
    "window_meta",
    "windows_from_meta",
    "windows_topic",
]

CLOSE_TIMERS = "close"  # member [window, end, group] -> end: the window's result is due
EXPIRE_TIMERS = "expire"  # member [window, start, group] -> last end + retention: delete bucket
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def windows_topic(processor: str) -> str:
    """The topic a processor's closed windows are emitted to."""
    return f"{processor}.windows"


_MAX_SCALE = 18
_INT64 = 2**63


def scales_of(fold: object) -> dict[str, int]:
    """A window fold's decimal measures and their scales (``scales``; none: all integers).

    Raises:
        ContractError: A scale is not an integer from 0 to 18.
    """
    scales = dict(getattr(fold, "scales", None) or {})
    for name, scale in scales.items():
        if isinstance(scale, bool) or not isinstance(scale, int) or not 0 <= scale <= _MAX_SCALE:
            msg = f"measure {name!r}: a scale is an integer from 0 to {_MAX_SCALE}, not {scale!r}"
            raise ContractError(msg)
    return scales


def to_units(name: str, value: object, scale: int | None) -> int:
    """A measured value as the integer a bucket holds: itself, or its ``10**-scale`` units.

    A decimal measure takes an ``int``, a :class:`~decimal.Decimal` or a ``float`` (read as the
    shortest decimal that prints as it: ``0.1`` is ``0.1``); digits past the scale are rounded
    half to even. An integer measure (no scale) takes integers only.

    Raises:
        ValueError: The value is not a number of its kind, or does not fit in 64 bits.
    """
    if type(value) is int and scale is None and -_INT64 <= value < _INT64:
        return value  # the common case, first (per measured event)
    if isinstance(value, bool) or not isinstance(value, int | Decimal | float):
        msg = f"measure {name!r} is {value!r}, not a number"
        raise ValueError(msg)
    if scale is None:
        if not isinstance(value, int):
            msg = (
                f"measure {name!r} is {value!r}, not an integer: declare its scale in the "
                f"fold's scales (e.g. scales = {{{name!r}: 2}}) to measure decimals"
            )
            raise ValueError(msg)
        units = value
    else:
        try:
            with localcontext() as context:
                context.prec = 60
                exact = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
                units = int(exact.scaleb(scale).to_integral_value(ROUND_HALF_EVEN))
        except (InvalidOperation, OverflowError, ValueError):
            msg = f"measure {name!r} is {value!r}, not a finite number"
            raise ValueError(msg) from None
    if not -_INT64 <= units < _INT64:
        msg = f"measure {name!r} is {value!r}: out of the 64-bit range of a bucket"
        raise ValueError(msg)
    return units


def from_units(units: int, scale: int) -> Decimal:
    """The inverse of :func:`to_units` for a decimal measure: the value in the user's units."""
    return Decimal(units).scaleb(-scale)


def _check(name: str, size_ms: int, every_ms: int, what: str) -> None:
    problems = []
    if not _NAME.fullmatch(name):
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
    emit: bool = True

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.size_ms, "itself")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored bucket."""
        return self.size_ms

    @property
    def grid_ms(self) -> int:
        """Events in one step of this grid (from 0) add to the same buckets."""
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
    emit: bool = True

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.hop_ms, "hop_ms")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored bucket (a whole window)."""
        return self.size_ms

    @property
    def grid_ms(self) -> int:
        """Events in one hop (from 0) add to the same buckets."""
        return self.hop_ms

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
    emit: bool = True

    def __post_init__(self) -> None:
        _check(self.name, self.size_ms, self.step_ms, "step_ms")

    @property
    def bucket_ms(self) -> int:
        """The length of one stored (fine) bucket."""
        return self.step_ms

    @property
    def grid_ms(self) -> int:
        """Events in one step (from 0) add to the same fine bucket."""
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

_KINDS: dict[str, type[Tumbling] | type[Hopping] | type[Sliding]] = {
    "tumbling": Tumbling,
    "hopping": Hopping,
    "sliding": Sliding,
}


def window_meta(
    windows: Iterable[Window], distinct: Iterable[str] = (), scales: Mapping[str, int] | None = None
) -> dict[str, str]:
    """A generation's meta fields that describe its windows, for readers without its code.

    The processor records them on start; the query API rebuilds the windows from them
    (:func:`windows_from_meta`), so a service never imports a user's processor package.
    """
    described = []
    for window in windows:
        kind = next(k for k, cls in _KINDS.items() if isinstance(window, cls))
        fields = {"kind": kind, "name": window.name, "size_ms": window.size_ms}
        if isinstance(window, Hopping):
            fields["hop_ms"] = window.hop_ms
        elif isinstance(window, Sliding):
            fields["step_ms"] = window.step_ms
        described.append(fields)
    return {
        "windows": orjson.dumps(described).decode(),
        "distinct": orjson.dumps(list(distinct)).decode(),
        "scales": orjson.dumps(dict(scales or {})).decode(),
    }


def windows_from_meta(meta: Mapping[str, str]) -> tuple[list[Window], list[str]]:
    """The windows and distinct measures :func:`window_meta` recorded (empty when none).

    Raises:
        ContractError: The fields are not what :func:`window_meta` writes.
    """
    try:
        described = orjson.loads(meta.get("windows", "[]"))
        distinct = [str(d) for d in orjson.loads(meta.get("distinct", "[]"))]
        windows: list[Window] = [
            _KINDS[d.pop("kind")](**{k: v for k, v in d.items() if k != "emit"}) for d in described
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"a generation's window meta is not readable: {exc}"
        raise ContractError(msg) from exc
    return windows, distinct


def scales_from_meta(meta: Mapping[str, str]) -> dict[str, int]:
    """The decimal measures' scales :func:`window_meta` recorded (none before they existed).

    Raises:
        ContractError: The field is not what :func:`window_meta` writes.
    """
    try:
        return {str(k): int(v) for k, v in orjson.loads(meta.get("scales", "{}")).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        msg = f"a generation's window scales are not readable: {exc}"
        raise ContractError(msg) from exc


def encode_timer(window: str, at: int, group: str) -> bytes:
    """A timer member: window, time (an end or a start) and group."""
    return orjson.dumps([window, at, group])


def decode_timer(member: bytes | str) -> tuple[str, int, str]:
    """Inverse of :func:`encode_timer`."""
    window, at, group = orjson.loads(member)
    return str(window), int(at), str(group)


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
    scales: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A window's result as emitted and read: aggregates, averages and distinct counts.

    ``aggregates`` are the buckets' integers. A decimal measure's ``sum:``, ``min:`` and
    ``max:`` (``scales``) come back as :class:`~decimal.Decimal` in the user's units.
    ``avg:<m>`` is ``sum:<m> / count`` (a float); distinct counts are HyperLogLog estimates.
    """
    count = aggregates.get("count", 0)
    if not count:  # an emptied sliding window: nothing but its count
        aggregates, distinct = {"count": 0}, {}
    values: dict[str, int | Decimal] = {}
    for name, units in sorted(aggregates.items()):
        scale = (scales or {}).get(name[4:]) if name[:4] in ("sum:", "min:", "max:") else None
        values[name] = units if scale is None else from_units(units, scale)
    averages = {
        f"avg:{name[4:]}": float(value / count)
        for name, value in values.items()
        if name.startswith("sum:") and count
    }
    return {
        "window": window.name,
        "group": group,
        "start": end - window.size_ms,
        "end": end,
        **values,
        **averages,
        **{f"distinct:{k}": v for k, v in sorted((distinct or {}).items())},
    }


# Closed windows go out as records of this contract (the ``windows`` contract set, registered
# through the ``refold.contracts`` entry point like any user's), so processors can chain on them.
WINDOW_RESULT = "WindowResult"
WINDOW_RESULTS = ContractSet(name="windows", schemas=SCHEMA_ROOT / "windows")


def result_record(
    processor: str, result: Mapping[str, Any], scales: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A result of :func:`result_of` as a ``WindowResult`` record (its contract's shape).

    Aggregates stay exact integers in the record: a decimal measure's in ``10**-scale`` units,
    with its scale in ``scales`` (:func:`result_from_record` turns them back into decimals).
    """
    fixed = ("window", "group", "start", "end", "count")
    scales = dict(scales or {})
    return {
        "processor": processor,
        "window": result["window"],
        "group": str(result["group"]),
        "start": result["start"],
        "end": result["end"],
        "count": result.get("count", 0),
        "aggregates": {
            k: v if k[4:] not in scales else to_units(k[4:], v, scales[k[4:]])
            for k, v in result.items()
            if k not in fixed and k.startswith(("sum:", "min:", "max:"))
        },
        "averages": {k: float(v) for k, v in result.items() if k.startswith("avg:")},
        "distinct": {k[9:]: v for k, v in result.items() if k.startswith("distinct:")},
        "scales": scales,
    }


def result_from_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A ``WindowResult`` record back in :func:`result_of`'s shape (decimals as decimals)."""
    scales = record.get("scales") or {}
    return {
        "window": record["window"],
        "group": record["group"],
        "start": record["start"],
        "end": record["end"],
        "count": record["count"],
        **{
            k: v if k[4:] not in scales else from_units(v, scales[k[4:]])
            for k, v in record["aggregates"].items()
        },
        **record["averages"],
        **{f"distinct:{k}": v for k, v in record["distinct"].items()},
    }


def watermark_of(
    clocks: Mapping[str, int], lateness_ms: int, partitions: Iterable[str] | None = None
) -> int | None:
    """A processor's watermark: the minimum over its partitions' clocks minus the lateness.

    Args:
        clocks: ``topic/partition`` -> largest event time seen.
        lateness_ms: The allowed lateness.
        partitions: Every partition of the processor (its positions' fields). ``None`` until
            each has a clock: a partition that has not started may still bring events of any
            time, all on time (a table rebuilt partition by partition would otherwise join
            events before their rows are in). Without it, the clocks there are.
    """
    names = list(clocks) if partitions is None else list(partitions)
    if not names or any(name not in clocks for name in names):
        return None
    return min(clocks[name] for name in names) - lateness_ms
