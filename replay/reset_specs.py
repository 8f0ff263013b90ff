"""Reset specs: where a rebuild starts, as Kafka's ``kafka-consumer-groups --reset-offsets``.

Frozen dataclasses, one per spec, and their union :data:`ResetSpec`; the parsers of the
command line's values (a time, a duration, an offsets file, a topic scope); and
:func:`requested_offset`, the offset a spec asks for on one partition. Pure: a plan
(:mod:`refold.replay.plan`) resolves them against the log.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from refold.replay.errors import PlanError

__all__ = [
    "TIME_SPECS",
    "ByDuration",
    "FromFile",
    "FromOffset",
    "ResetSpec",
    "ShiftBy",
    "ToCurrent",
    "ToDatetime",
    "ToEarliest",
    "ToLatest",
    "TopicPartition",
    "parse_datetime",
    "parse_duration",
    "parse_offsets_csv",
    "parse_scope",
    "requested_offset",
]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ToEarliest:
    """Rebuild from the first retained offset of every partition."""

    def describe(self) -> str:
        """For the plan's header."""
        return "--to-earliest"


@dataclass(frozen=True, slots=True)
class ToLatest:
    """Start at the log end: the new generation folds only what arrives from now on."""

    def describe(self) -> str:
        """For the plan's header."""
        return "--to-latest"


@dataclass(frozen=True, slots=True)
class ToCurrent:
    """Start where the live generation is now."""

    def describe(self) -> str:
        """For the plan's header."""
        return "--to-current"


@dataclass(frozen=True, slots=True)
class FromOffset:
    """Rebuild from one offset on every partition in scope."""

    offset: int

    def describe(self) -> str:
        """For the plan's header."""
        return f"--from-offset {self.offset}"


@dataclass(frozen=True, slots=True)
class ShiftBy:
    """Move the live generation's position by ``shift`` records (negative: back)."""

    shift: int

    def describe(self) -> str:
        """For the plan's header."""
        return f"--shift-by {self.shift:+d}"


@dataclass(frozen=True, slots=True)
class ToDatetime:
    """Start at the first record at or after ``when`` (time-zone aware)."""

    when: datetime

    def describe(self) -> str:
        """For the plan's header."""
        return f"--to-datetime {self.when.isoformat()}"


@dataclass(frozen=True, slots=True)
class ByDuration:
    """Start at the first record at or after ``now - duration``."""

    duration: timedelta
    now: datetime

    @property
    def when(self) -> datetime:
        """The instant the duration points back to."""
        return self.now - self.duration

    def describe(self) -> str:
        """For the plan's header."""
        return f"--by-duration {self.duration} (from {self.when.isoformat()})"


@dataclass(frozen=True, slots=True)
class FromFile:
    """Explicit offsets per partition (Kafka's reset-offsets CSV)."""

    offsets: Mapping[TopicPartition, int] = field(hash=False)
    source: str = "file"

    def describe(self) -> str:
        """For the plan's header."""
        return f"--from-file {self.source}"


ResetSpec = (
    ToEarliest | ToLatest | ToCurrent | FromOffset | ShiftBy | ToDatetime | ByDuration | (FromFile)
)
TIME_SPECS = (ToDatetime, ByDuration)


def parse_datetime(text: str) -> datetime:
    """Parse ISO-8601 with a required time zone.

    Raises:
        PlanError: Not ISO-8601, or no time zone (Kafka's tool silently reads those as UTC;
            refold refuses to guess).
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        msg = f"--to-datetime {text!r} is not ISO-8601 (e.g. 2026-11-22T09:30:00+01:00)"
        raise PlanError(msg) from None
    if when.tzinfo is None:
        msg = (
            f"--to-datetime {text!r} has no time zone. Add one (e.g. {text}Z or "
            f"{text}+01:00): a naive time is ambiguous, and Kafka's tool would silently "
            "read it as UTC."
        )
        raise PlanError(msg)
    return when


_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?"
    r"(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration ``PnDTnHnMnS`` (as Kafka's ``--by-duration``).

    Raises:
        PlanError: Not of that form, or zero.
    """
    match = _DURATION.match(text.strip().upper())
    if match is None or not any(match.groupdict().values()) or text.strip().upper().endswith("T"):
        msg = f"--by-duration {text!r} is not PnDTnHnMnS (e.g. PT30M, P1DT12H)"
        raise PlanError(msg)
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    duration = timedelta(**parts)
    if duration <= timedelta(0):
        msg = f"--by-duration {text!r} is zero"
        raise PlanError(msg)
    return duration


def parse_offsets_csv(text: str) -> dict[TopicPartition, int]:
    """Read ``topic,partition,offset`` lines (also ``group,topic,partition,offset``).

    Raises:
        PlanError: A line that is not of either form, with its number.
    """
    offsets: dict[TopicPartition, int] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if len(cells) == 4:
            cells = cells[1:]
        if len(cells) != 3:
            msg = f"line {number}: expected topic,partition,offset, got {','.join(row)!r}"
            raise PlanError(msg)
        topic, partition, offset = cells
        if number == 1 and not partition.lstrip("-").isdigit():
            continue  # a header row
        try:
            offsets[(topic, int(partition))] = int(offset)
        except ValueError:
            msg = f"line {number}: partition and offset must be integers: {','.join(row)!r}"
            raise PlanError(msg) from None
    if not offsets:
        msg = "the offsets file has no topic,partition,offset lines"
        raise PlanError(msg)
    return offsets


def parse_scope(values: list[str] | None) -> dict[str, set[int] | None] | None:
    """Parse ``--topic t`` / ``--topic t:0,1,2`` options into ``{topic: partitions or None}``.

    Raises:
        PlanError: A partition list is not comma-separated integers.
    """
    if not values:
        return None
    scope: dict[str, set[int] | None] = {}
    for value in values:
        topic, sep, parts = value.partition(":")
        if not sep:
            scope[topic] = None
            continue
        try:
            partitions = {int(p) for p in parts.split(",") if p.strip()}
        except ValueError:
            msg = f"--topic {value}: expected topic or topic:0,1,2"
            raise PlanError(msg) from None
        if topic in scope and scope[topic] is None:
            continue  # the whole topic is in scope already
        scope[topic] = (scope.get(topic) or set()) | partitions
    return scope


def requested_offset(
    spec: ResetSpec,
    tp: TopicPartition,
    bounds: tuple[int, int],
    current: Mapping[TopicPartition, int],
    at_time: Mapping[TopicPartition, int],
) -> int | None:
    """The offset a spec asks for on one partition; None when the spec does not cover it."""
    log_start, log_end = bounds
    if isinstance(spec, ToEarliest):
        return log_start
    if isinstance(spec, ToLatest):
        return log_end
    if isinstance(spec, ToCurrent):
        return current.get(tp, log_start)
    if isinstance(spec, ShiftBy):
        return current.get(tp, log_start) + spec.shift
    if isinstance(spec, FromOffset):
        return spec.offset
    if isinstance(spec, FromFile):
        return spec.offsets.get(tp)
    return at_time[tp]
