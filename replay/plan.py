"""Replay plans: pure functions from a reset spec and log offsets to per-partition targets.

A plan never touches a broker or Redis: :mod:`refold.replay.rebuild` gathers the log bounds, the
live generation's positions and (for time specs) the offsets at a time, and passes them in. The
reset specs are those of Kafka's ``kafka-consumer-groups --reset-offsets``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from refold.contracts.kafka.offsets_json import to_offsets_json
from refold.replay.errors import PlanError

__all__ = [
    "TIME_SPECS",
    "ByDuration",
    "FromFile",
    "FromOffset",
    "PartitionPlan",
    "PlanCheck",
    "ReplayPlan",
    "ResetSpec",
    "SeedPoint",
    "ShiftBy",
    "ToCurrent",
    "ToDatetime",
    "ToEarliest",
    "ToLatest",
    "build_plan",
    "parse_datetime",
    "parse_duration",
    "parse_offsets_csv",
    "parse_scope",
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


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """One partition of a plan.

    Attributes:
        topic: Topic.
        partition: Partition.
        current: Next offset the live generation will apply (None: no live generation).
        target: Offset the new generation starts from.
        log_start: First retained offset.
        log_end: Offset the next record will get.
        note: Why the target differs from what was asked, if it does.
        seed_position: Where a seeded rebuild really starts folding (the snapshot's position,
            at or before the target); None when the new generation starts empty.
    """

    topic: str
    partition: int
    current: int | None
    target: int
    log_start: int
    log_end: int
    note: str = ""
    seed_position: int | None = None

    @property
    def begin(self) -> int:
        """First offset the new generation folds."""
        return self.target if self.seed_position is None else self.seed_position

    @property
    def events(self) -> int:
        """Records the new generation reprocesses to reach today's log end."""
        return max(0, self.log_end - self.begin)


@dataclass(frozen=True, slots=True)
class SeedPoint:
    """A state snapshot a rebuild starts from (see :mod:`refold.replay.snapshots`).

    Attributes:
        name: ``g<N>/s<S>``.
        positions: The snapshot's applied positions (next offset per partition).
        created_at: Unix time it was taken.
        generation: The generation it was taken from.
        snapshot: Its id within that generation.
    """

    name: str
    positions: Mapping[TopicPartition, int]
    created_at: float
    generation: int = 0
    snapshot: int = 0


@dataclass(frozen=True, slots=True)
class PlanCheck:
    """One validation of a plan: passed or not, what was found, what to do about it."""

    name: str
    ok: bool
    detail: str
    action: str = ""


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a replay will do, partition by partition."""

    processor: str
    spec: str
    live_generation: int | None
    partitions: tuple[PartitionPlan, ...]
    warnings: tuple[str, ...] = ()
    seed: SeedPoint | None = None
    checks: tuple[PlanCheck, ...] = ()

    @property
    def total_events(self) -> int:
        """Records to reprocess across partitions."""
        return sum(p.events for p in self.partitions)

    @property
    def needs_state(self) -> bool:
        """True when some target is past the log start.

        The records before a target are not folded again, so the new generation must start
        from a snapshot of the state as of then.
        """
        return any(r.target > r.log_start for r in self.partitions)

    @property
    def ready(self) -> bool:
        """Every check passed (a plan with failed checks is never executed)."""
        return all(c.ok for c in self.checks)

    def with_seed(self, seed: SeedPoint) -> ReplayPlan:
        """The plan started from ``seed``: every partition folds from the snapshot's position."""
        rows = tuple(
            dataclasses.replace(
                r, seed_position=seed.positions.get((r.topic, r.partition), r.log_start)
            )
            for r in self.partitions
        )
        return dataclasses.replace(self, partitions=rows, seed=seed)

    def with_checks(self, checks: tuple[PlanCheck, ...]) -> ReplayPlan:
        """The plan with its validation results."""
        return dataclasses.replace(self, checks=self.checks + checks)

    def starting_offsets(self) -> str:
        """The new generation's ``startingOffsets`` in Spark's JSON form (stable key order)."""
        return to_offsets_json({(row.topic, row.partition): row.begin for row in self.partitions})

    def as_dict(self) -> dict[str, object]:
        """The plan for scripts (``--json``)."""
        return {
            "processor": self.processor,
            "spec": self.spec,
            "live_generation": self.live_generation,
            "total_events": self.total_events,
            "starting_offsets": json.loads(self.starting_offsets()),
            "partitions": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "current": r.current,
                    "target": r.target,
                    "log_start": r.log_start,
                    "log_end": r.log_end,
                    "begin": r.begin,
                    "events": r.events,
                    "note": r.note,
                }
                for r in self.partitions
            ],
            "seed": None
            if self.seed is None
            else {"snapshot": self.seed.name, "created_at": self.seed.created_at},
            "checks": [
                {"name": c.name, "ok": c.ok, "detail": c.detail, "action": c.action}
                for c in self.checks
            ],
            "ready": self.ready,
            "warnings": list(self.warnings),
        }

    def export_csv(self) -> str:
        """``topic,partition,offset`` lines: readable by ``--from-file`` and Kafka's tool."""
        return "".join(f"{r.topic},{r.partition},{r.target}\n" for r in self.partitions)

    def render(self) -> str:
        """The plan as a table for people."""
        live = "none" if self.live_generation is None else f"g{self.live_generation}"
        lines = [
            f"replay plan for {self.processor} ({self.spec}); live generation: {live}",
            f"{'TOPIC':<28} {'PART':>4} {'CURRENT':>10} {'TARGET':>10} {'LOG-END':>10} "
            f"{'TO REPROCESS':>12}  NOTE",
        ]
        for row in self.partitions:
            current = "-" if row.current is None else str(row.current)
            lines.append(
                f"{row.topic:<28} {row.partition:>4} {current:>10} {row.target:>10} "
                f"{row.log_end:>10} {row.events:>12}  {row.note}"
            )
        lines.append(f"{'total':<28} {'':>4} {'':>10} {'':>10} {'':>10} {self.total_events:>12}")
        if self.seed is not None:
            lines.append(
                f"seeded from snapshot {self.seed.name}: each partition folds from the "
                "snapshot's position (at or before its target)"
            )
        lines.extend(f"warning: {w}" for w in self.warnings)
        if self.checks:
            lines.append("checks:")
            for check in self.checks:
                mark = "ok  " if check.ok else "FAIL"
                lines.append(f"  {mark} {check.name:<10} {check.detail}")
                if check.action and not check.ok:
                    lines.append(f"       {'':<10} what to do: {check.action}")
        return "\n".join(lines)


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


def _requested(
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


def build_plan(
    processor: str,
    spec: ResetSpec,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    current: Mapping[TopicPartition, int],
    live_generation: int | None,
    scope: dict[str, set[int] | None] | None = None,
    *,
    at_time: Mapping[TopicPartition, int] | None = None,
    allow_data_loss: bool = False,
) -> ReplayPlan:
    """Resolve a reset spec against the log.

    A new generation starts empty, so partitions outside ``scope`` (or missing from a
    ``--from-file``) are folded from their earliest offset; the scope narrows which partitions
    the spec applies to.

    Args:
        processor: Processor name.
        spec: Where to start.
        bounds: ``(log_start, log_end)`` of every partition of the processor's topics.
        current: Applied positions of the live generation.
        live_generation: The live generation, if any.
        scope: From :func:`parse_scope`; None = every partition.
        at_time: For time specs: the first offset at or after the time, per partition.
        allow_data_loss: Clamp targets below the log start instead of refusing.

    Returns:
        The plan. Targets past the log end are clamped to it, with a note, as Kafka's tool does.

    Raises:
        PlanError: The scope names an unknown topic or partition, the file names partitions
            the processor does not read, or a target lies below the log start (records gone)
            without ``allow_data_loss``.
    """
    topics = {t for t, _ in bounds}
    for topic, partitions in (scope or {}).items():
        if topic not in topics:
            msg = f"{processor} does not read topic {topic}; it reads {', '.join(sorted(topics))}"
            raise PlanError(msg)
        missing = sorted((partitions or set()) - {p for t, p in bounds if t == topic})
        if missing:
            msg = f"topic {topic} has no partition {', '.join(map(str, missing))}"
            raise PlanError(msg)
    if isinstance(spec, FromFile):
        unknown = sorted(set(spec.offsets) - set(bounds))
        if unknown:
            names = ", ".join(f"{t}/{p}" for t, p in unknown)
            msg = f"the offsets file names partitions {processor} does not read: {names}"
            raise PlanError(msg)
    rows = []
    lost = []
    for tp, (log_start, log_end) in sorted(bounds.items()):
        topic, partition = tp
        in_scope = scope is None or (
            topic in scope and (scope[topic] is None or partition in (scope[topic] or set()))
        )
        wanted = (
            _requested(spec, tp, (log_start, log_end), current, at_time or {})
            if (in_scope)
            else None
        )
        note = ""
        if wanted is None:
            target = log_start
            note = ("not in the offsets file" if in_scope else "outside --topic scope") + (
                ": from earliest (a new generation starts empty)"
            )
        elif wanted < log_start:
            if not allow_data_loss:
                lost.append(f"{topic}/{partition}: {wanted} < log start {log_start}")
            target, note = log_start, f"clamped up from {wanted}: records before are gone"
        elif wanted > log_end:
            target, note = log_end, f"clamped down from {wanted} to the log end"
        else:
            target = wanted
        rows.append(
            PartitionPlan(topic, partition, current.get(tp), target, log_start, log_end, note)
        )
    if lost:
        msg = (
            "targets below the log start (those records were deleted): "
            + "; ".join(lost)
            + ". Operator action: choose a later target, or pass --allow-data-loss to start "
            "at the log start instead."
        )
        raise PlanError(msg)
    return ReplayPlan(processor, spec.describe(), live_generation, tuple(rows))
