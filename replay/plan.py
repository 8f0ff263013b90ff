"""Replay plans: pure functions from a reset spec and log offsets to per-partition targets.

A plan never touches a broker or Redis: :mod:`refold.replay.rebuild` gathers the log bounds, the
live generation's positions and (for time specs) the offsets at a time, and passes them in. The
reset specs are those of Kafka's ``kafka-consumer-groups --reset-offsets``; they and their
parsers are :mod:`refold.replay.reset_specs`, imported here too (the path callers use).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from refold.contracts.archive_coverage import CoveredRanges, Span
from refold.contracts.kafka.offsets_json import to_offsets_json
from refold.replay.errors import PlanError
from refold.replay.reset_specs import (
    TIME_SPECS,
    ByDuration,
    FromFile,
    FromOffset,
    ResetSpec,
    ShiftBy,
    ToCurrent,
    ToDatetime,
    ToEarliest,
    ToLatest,
    TopicPartition,
    parse_datetime,
    parse_duration,
    parse_offsets_csv,
    parse_scope,
    requested_offset,
)

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
        archived: The ranges of the partition the archive holds every record of (the log's
            cold tier): a rebuild folds ``[begin, log_start)`` from there when they cover it.
        end: The offset a bounded rebuild stops before (``replay --until``: a state as of a
            moment); None: it folds on to the log end and beyond.
    """

    topic: str
    partition: int
    current: int | None
    target: int
    log_start: int
    log_end: int
    note: str = ""
    seed_position: int | None = None
    archived: CoveredRanges = field(default_factory=CoveredRanges)
    end: int | None = None

    @property
    def from_archive(self) -> int:
        """Records below the log start that the rebuild reads from the archive."""
        return max(0, self.log_start - self.begin)

    @property
    def lost(self) -> list[Span]:
        """Offsets the rebuild would fold that neither the log nor the archive has."""
        if self.begin >= self.log_start:
            return []
        return self.archived.gaps(self.begin, self.log_start)

    @property
    def begin(self) -> int:
        """First offset the new generation folds."""
        return self.target if self.seed_position is None else self.seed_position

    @property
    def events(self) -> int:
        """Records the new generation reprocesses to reach today's log end (or its bound)."""
        return max(0, (self.log_end if self.end is None else self.end) - self.begin)


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
    # The moment a bounded plan stops at (an ISO time, or "offsets"); "" folds on to the end.
    until: str = ""

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

    def ending_offsets(self) -> str | None:
        """A bounded plan's ``endingOffsets`` in Spark's JSON form; None when unbounded."""
        if not self.until:
            return None
        return to_offsets_json(
            {(r.topic, r.partition): r.end for r in self.partitions if r.end is not None}
        )

    def as_dict(self) -> dict[str, object]:
        """The plan for scripts (``--json``)."""
        return {
            "processor": self.processor,
            "spec": self.spec,
            "live_generation": self.live_generation,
            "total_events": self.total_events,
            "starting_offsets": json.loads(self.starting_offsets()),
            "until": self.until or None,
            "ending_offsets": json.loads(self.ending_offsets() or "null"),
            "partitions": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "current": r.current,
                    "target": r.target,
                    "log_start": r.log_start,
                    "log_end": r.log_end,
                    "begin": r.begin,
                    "end": r.end,
                    "events": r.events,
                    "from_archive": r.from_archive,
                    "archived": [list(span) for span in r.archived.ranges],
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
            f"{'TOPIC':<28} {'PART':>4} {'CURRENT':>10} {'TARGET':>10} {'ARCHIVE':>14} "
            f"{'LOG-START':>10} {'LOG-END':>10} {'TO REPROCESS':>12}  NOTE",
        ]
        for row in self.partitions:
            current = "-" if row.current is None else str(row.current)
            bound = "" if row.end is None else f"stops before {row.end}"
            note = "; ".join(n for n in (bound, row.note) if n)
            lines.append(
                f"{row.topic:<28} {row.partition:>4} {current:>10} {row.target:>10} "
                f"{_archive_column(row):>14} {row.log_start:>10} {row.log_end:>10} "
                f"{row.events:>12}  {note}"
            )
        lines.append(
            f"{'total':<28} {'':>4} {'':>10} {'':>10} {'':>14} {'':>10} {'':>10} "
            f"{self.total_events:>12}"
        )
        if self.seed is not None:
            lines.append(
                f"seeded from snapshot {self.seed.name}: each partition folds from the "
                "snapshot's position (at or before its target)"
            )
        if self.until:
            lines.append(
                f"as of {self.until}: the new generation stops at these bounds and is kept "
                "beside the live one (status as_of), without a flip"
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


def _archive_column(row: PartitionPlan) -> str:
    """The archive's range that holds the partition's head: ``first-end`` (end exclusive)."""
    below = [s for s in row.archived.ranges if s[0] < row.log_start]
    return "-" if not below else f"{below[0][0]}-{below[-1][1]}"


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
    archived: Mapping[TopicPartition, CoveredRanges] | None = None,
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
        archived: The archive's covered ranges per partition (the log's cold tier): a target
            below the log start is kept when they cover it up to the log start.

    Returns:
        The plan. Targets past the log end are clamped to it, with a note, as Kafka's tool does.

    Raises:
        PlanError: The scope names an unknown topic or partition, the file names partitions
            the processor does not read, or a target lies below the log start (records gone,
            and not in the archive) without ``allow_data_loss``.
    """
    _check_scope(processor, spec, bounds, scope)
    rows = []
    lost = []
    for tp, (log_start, log_end) in sorted(bounds.items()):
        topic, partition = tp
        in_scope = scope is None or (
            topic in scope and (scope[topic] is None or partition in (scope[topic] or set()))
        )
        wanted = (
            requested_offset(spec, tp, (log_start, log_end), current, at_time or {})
            if (in_scope)
            else None
        )
        note = ""
        covered = (archived or {}).get(tp, CoveredRanges())
        if wanted is not None and isinstance(spec, ToEarliest):
            wanted = covered.earliest_before(log_start)  # all of history: the archive's too
        gaps = covered.gaps(wanted, log_start) if wanted is not None and wanted < log_start else []
        if wanted is None:
            target = log_start
            note = ("not in the offsets file" if in_scope else "outside --topic scope") + (
                ": from earliest (a new generation starts empty)"
            )
        elif wanted < log_start and not gaps:
            target, note = wanted, f"{wanted}..{log_start - 1} from the archive, then the log"
        elif wanted < log_start:
            if not allow_data_loss:
                missing = ", ".join(f"{s}..{e - 1}" for s, e in gaps)
                in_archive = f" (the archive lacks {missing})" if covered.ranges else ""
                lost.append(f"{topic}/{partition}: {wanted} < log start {log_start}{in_archive}")
            target, note = log_start, f"clamped up from {wanted}: records before are gone"
        elif wanted > log_end:
            target, note = log_end, f"clamped down from {wanted} to the log end"
        else:
            target = wanted
        rows.append(
            PartitionPlan(
                topic, partition, current.get(tp), target, log_start, log_end, note, None, covered
            )
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


def _check_scope(
    processor: str,
    spec: ResetSpec,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    scope: dict[str, set[int] | None] | None,
) -> None:
    """Refuse a scope or an offsets file naming topics or partitions the processor lacks."""
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
