"""State as of a moment: the bound of a generation that ``replay --until`` builds (pure).

A bound is a time (``--until``: per partition, the first offset whose record timestamp is after
it, from Kafka's time index) or explicit offsets (``--until-offsets``). The rebuild folds from
its targets up to, excluding, those ending offsets, stops, and keeps the generation beside the
live one with status ``as_of`` (DESIGN.md decision 21). Windows, timers and patterns in it are
as they were then: the fold saw exactly the records before the bound, in log order.

:mod:`refold.replay.rebuild` reads the log (the offsets at the time, the first and last
records' timestamps) and passes them here; nothing here touches a broker or Redis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from refold.contracts.kafka.offsets_json import parse_offsets_json
from refold.replay.errors import PlanError
from refold.replay.plan import ReplayPlan
from refold.replay.reset_specs import TopicPartition, parse_datetime, parse_offsets_csv

__all__ = [
    "LogTimes",
    "Until",
    "UntilOffsets",
    "UntilTime",
    "bound_plan",
    "check_moment",
    "ending_offsets",
    "parse_until",
    "parse_until_offsets",
]


@dataclass(frozen=True, slots=True)
class UntilTime:
    """The state as of ``when``: every record whose timestamp is at or before it, per partition.

    Per partition the bound is the first offset whose record timestamp is after ``when``
    (Kafka's ListOffsets by time for ``when`` + 1 ms): the log's order decides, as it does for
    ``--to-datetime``.
    """

    when: datetime

    @property
    def moment(self) -> str:
        """What the generation's meta records (``as_of``)."""
        return self.when.isoformat()

    @property
    def after_ms(self) -> int:
        """The time to look up: the first record after ``when`` (ms) is the bound."""
        return int(self.when.timestamp() * 1000) + 1

    def describe(self) -> str:
        """For the plan's header."""
        return f"--until {self.moment}"


@dataclass(frozen=True, slots=True)
class UntilOffsets:
    """The state as of explicit positions: per partition, the offset the fold stops before."""

    offsets: Mapping[TopicPartition, int] = field(hash=False)

    @property
    def moment(self) -> str:
        """What the generation's meta records (``as_of``)."""
        return "offsets"

    def describe(self) -> str:
        """For the plan's header."""
        return "--until-offsets " + ",".join(f"{t}/{p}:{o}" for (t, p), o in self.offsets.items())


Until = UntilTime | UntilOffsets


@dataclass(frozen=True, slots=True)
class LogTimes:
    """The timestamps (ms) of the first and the last record of the processor's partitions."""

    first_ms: int | None
    last_ms: int | None

    def describe(self) -> str:
        """``from <first> to <last>`` (or that the log is empty)."""
        if self.first_ms is None or self.last_ms is None:
            return "the log has no records"
        return f"the log's records run from {_iso(self.first_ms)} to {_iso(self.last_ms)}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def parse_until_offsets(text: str) -> dict[TopicPartition, int]:
    """``--until-offsets``: Spark's JSON ``{"topic":{"0":42}}`` or ``topic,partition,offset`` CSV.

    CSV lines are separated by newlines or ``;`` (one argument on a command line).

    Raises:
        PlanError: Neither form, or a negative offset.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            offsets = parse_offsets_json(stripped)
        except ValueError as exc:
            msg = f"--until-offsets is not offsets JSON ({exc}): {stripped[:200]}"
            raise PlanError(msg) from None
    else:
        offsets = parse_offsets_csv(stripped.replace(";", "\n"))
    negative = sorted(f"{t}/{p}={o}" for (t, p), o in offsets.items() if o < 0)
    if negative:
        msg = f"--until-offsets takes offsets >= 0: {', '.join(negative)}"
        raise PlanError(msg)
    return offsets


def parse_until(until: str | None, until_offsets: str | None) -> Until | None:
    """The bound ``replay plan``'s ``--until`` / ``--until-offsets`` name, if any."""
    if until:
        return UntilTime(parse_datetime(until))
    if until_offsets:
        return UntilOffsets(parse_until_offsets(until_offsets))
    return None


def check_moment(until: UntilTime, times: LogTimes, now: datetime) -> None:
    """Refuse a moment in the future or before the first event.

    Raises:
        PlanError: Naming the moment and the log's first and last timestamps.
    """
    moment_ms = until.after_ms - 1
    if until.when > now:
        msg = (
            f"--until {until.moment} is in the future (now is {now.isoformat()}); "
            f"{times.describe()}. Operator action: name a moment that has passed."
        )
        raise PlanError(msg)
    if times.first_ms is None:
        msg = f"--until {until.moment}: {times.describe()}, so there is no state as of then"
        raise PlanError(msg)
    if moment_ms < times.first_ms:
        msg = (
            f"--until {until.moment} is before the first event; {times.describe()}. "
            "Operator action: name a moment at or after the first event (a state before it "
            "is empty), or --until-offsets for records the archive holds below the log start."
        )
        raise PlanError(msg)


def ending_offsets(
    until: Until,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    after_time: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The offset each partition stops before.

    Args:
        until: The bound.
        bounds: ``(log_start, log_end)`` of every partition of the processor's topics.
        after_time: For :class:`UntilTime`: per partition, the first offset whose timestamp is
            at or after ``until.after_ms`` (the log end when none is).

    Raises:
        PlanError: ``--until-offsets`` misses a partition, names one the processor does not
            read, or names an offset past the log end (that moment has not happened).
    """
    if isinstance(until, UntilTime):
        found = after_time or {}
        return {tp: found.get(tp, end) for tp, (_start, end) in sorted(bounds.items())}
    named = dict(until.offsets)
    problems = []
    unknown = sorted(set(named) - set(bounds))
    if unknown:
        problems.append("names partitions it does not read: " + _tps(unknown))
    missing = sorted(set(bounds) - set(named))
    if missing:
        problems.append("misses partitions (a bound names every one): " + _tps(missing))
    ahead = sorted(
        f"{t}/{p}={named[(t, p)]} > {bounds[(t, p)][1]}"
        for t, p in set(named) & set(bounds)
        if named[(t, p)] > bounds[(t, p)][1]
    )
    if ahead:
        problems.append("goes past the log end: " + ", ".join(ahead))
    if problems:
        msg = f"--until-offsets {'; '.join(problems)}"
        raise PlanError(msg)
    return {tp: named[tp] for tp in sorted(bounds)}


def _tps(tps: list[TopicPartition]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in tps)


def bound_plan(plan: ReplayPlan, until: Until, ends: Mapping[TopicPartition, int]) -> ReplayPlan:
    """The plan stopped at ``ends``: each partition folds ``[begin, end)``.

    Raises:
        PlanError: A partition's bound is below where the rebuild starts on it (the moment is
            before the targets the other flags gave).
    """
    early = [
        f"{r.topic}/{r.partition}: {ends[(r.topic, r.partition)]} < {r.begin}"
        for r in plan.partitions
        if ends[(r.topic, r.partition)] < r.begin
    ]
    if early:
        msg = (
            f"{until.describe()} stops before the rebuild starts on {'; '.join(early)}. "
            "Operator action: start earlier (--to-earliest) or name a later moment."
        )
        raise PlanError(msg)
    rows = tuple(dataclasses.replace(r, end=ends[(r.topic, r.partition)]) for r in plan.partitions)
    return dataclasses.replace(
        plan, partitions=rows, spec=f"{plan.spec} {until.describe()}", until=until.moment
    )
