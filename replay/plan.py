"""Replay plans: pure functions from a reset spec and log offsets to per-partition targets.

A plan never touches a broker or Redis; :mod:`replay.__main__` gathers the offsets and the
executor runs the plan. The first version knows two reset specs; the full set (shift-by,
to-datetime, by-duration, from-file, ...) plugs in as more :data:`ResetSpec` kinds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from replay.errors import PlanError

__all__ = [
    "FromOffset",
    "PartitionPlan",
    "ReplayPlan",
    "ResetSpec",
    "ToEarliest",
    "build_plan",
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
class FromOffset:
    """Rebuild from one offset on every partition in scope."""

    offset: int

    def describe(self) -> str:
        """For the plan's header."""
        return f"--from-offset {self.offset}"


ResetSpec = ToEarliest | FromOffset


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
    """

    topic: str
    partition: int
    current: int | None
    target: int
    log_start: int
    log_end: int
    note: str = ""

    @property
    def events(self) -> int:
        """Records the new generation reprocesses to reach today's log end."""
        return max(0, self.log_end - self.target)


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a replay will do, partition by partition."""

    processor: str
    spec: str
    live_generation: int | None
    partitions: tuple[PartitionPlan, ...]
    warnings: tuple[str, ...] = ()

    @property
    def total_events(self) -> int:
        """Records to reprocess across partitions."""
        return sum(p.events for p in self.partitions)

    def starting_offsets(self) -> str:
        """The new generation's ``startingOffsets`` in Spark's JSON form (stable key order)."""
        nested: dict[str, dict[str, int]] = {}
        for row in self.partitions:
            nested.setdefault(row.topic, {})[str(row.partition)] = row.target
        return json.dumps(nested, sort_keys=True)

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
                    "events": r.events,
                    "note": r.note,
                }
                for r in self.partitions
            ],
            "warnings": list(self.warnings),
        }

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
        lines.extend(f"warning: {w}" for w in self.warnings)
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


def build_plan(
    processor: str,
    spec: ResetSpec,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    current: Mapping[TopicPartition, int],
    live_generation: int | None,
    scope: dict[str, set[int] | None] | None = None,
) -> ReplayPlan:
    """Resolve a reset spec against the log.

    A new generation starts empty, so partitions outside ``scope`` are folded from their
    earliest offset too; the scope narrows which partitions the spec applies to.

    Args:
        processor: Processor name.
        spec: Where to start.
        bounds: ``(log_start, log_end)`` of every partition of the processor's topics.
        current: Applied positions of the live generation.
        live_generation: The live generation, if any.
        scope: From :func:`parse_scope`; None = every partition.

    Returns:
        The plan; targets outside ``[log_start, log_end]`` are clamped, with a note, as
        Kafka's reset tool does.

    Raises:
        PlanError: The scope names a topic or partition the processor does not read.
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
    rows = []
    warnings = []
    for (topic, partition), (log_start, log_end) in sorted(bounds.items()):
        in_scope = scope is None or (
            topic in scope and (scope[topic] is None or partition in (scope[topic] or set()))
        )
        note = ""
        if not in_scope or isinstance(spec, ToEarliest):
            target = log_start
            if not in_scope:
                note = "outside --topic scope: from earliest (a new generation starts empty)"
        else:
            target = spec.offset
            if target < log_start:
                target, note = log_start, f"clamped up from {spec.offset} to the log start"
            elif target > log_end:
                target, note = log_end, f"clamped down from {spec.offset} to the log end"
        rows.append(
            PartitionPlan(
                topic, partition, current.get((topic, partition)), target, log_start, log_end, note
            )
        )
    if any(r.target > r.log_start for r in rows):
        warnings.append(
            "the new generation starts empty: records before each target are not folded into "
            "it. Use --to-earliest for a full rebuild."
        )
    return ReplayPlan(processor, spec.describe(), live_generation, tuple(rows), tuple(warnings))
