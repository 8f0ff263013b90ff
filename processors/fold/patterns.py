"""Complex event processing: patterns declared per key on event time, matched deterministically.

Pure (no I/O; picklable: shipped to Spark executors). A pattern processor is an ordinary entity
fold with timers (:mod:`refold.processors.fold.timers`) keyed by one field: the envelope, the
exactly-once writes, replay and the ``fold_timed`` oracle apply to it unchanged. Three kinds of
pattern, each matched per key:

- :class:`Sequence`: its steps in event-time order, the last within ``within_ms`` of the first
  (``OrderPaid`` then ``OrderCancelled`` within 10 minutes);
- :class:`CountWithin`: ``count`` matching events within ``within_ms`` (3 cancellations by one
  customer within an hour);
- :class:`Absence`: an ``after`` event not followed by an ``expect`` event within
  ``within_ms`` (paid but not shipped within 48 hours), fired once the watermark passes.

**Determinism.** :meth:`PatternProjection.apply` only buffers an event in its key's state.
Matching happens in ``on_timer``, which *settles* the buffered events strictly below the
watermark in event-time order, ties broken by ``(event type, event_id, content digest)``, a key
that does not depend on arrival; absence deadlines fire in the same pass. Every record folded
after a timer fired at watermark ``w`` has an event time ``>= w`` (it is on time), so the
settled events are exactly the key's on-time events below ``w``, in one order, whatever the
micro-batch boundaries, the interleaving of topics and partitions, or how many firings the
settling took: live state, the oracle and every replay find the same matches. The price is the
latency: a match is found once the watermark (newest event time minus the lateness) has passed
its last event, or an absence's deadline.

Boundaries (all inclusive, all in event-time milliseconds): a sequence completes when its last
step is at most ``within_ms`` after its first; ``count`` events count together when the last is
at most ``within_ms`` after the first; an ``expect`` at or before ``after + within_ms`` (and not
before the ``after``) disarms the absence, whose deadline fires once the watermark is above it.

Matches become insights: records of the ``Insight`` contract
(``contracts/schemas/insights/Insight.v1.avsc``), produced by the timer that found them on
``<processor>.insights``, keyed by the pattern's key, with a deterministic ``insight_id``.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from refold.contracts.insights import INSIGHT
from refold.contracts.processors import EventTime, ProcessorOptions
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.matching import (
    On,
    above,
    at_least,
    at_most,
    below,
    between,
    canonical,
    not_equal,
    one_of,
)
from refold.processors.fold.projection import SideEffect, State
from refold.processors.fold.timers import TIMER_EVENT

__all__ = [
    "Absence",
    "CountWithin",
    "On",
    "Pattern",
    "PatternConfigError",
    "PatternOptions",
    "PatternProjection",
    "Sequence",
    "above",
    "at_least",
    "at_most",
    "below",
    "between",
    "default_insights_topic",
    "not_equal",
    "one_of",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Open partial sequences and armed deadlines kept per key and pattern. A key with more starts
# than this inside one window drops its oldest (closest to expiring); 16 is far above what an
# order or a customer does within a pattern's window, and keeps a hostile key's state small.
_MAX_OPEN = 16

Entry = list[Any]  # a buffered event: [time, event type, ref, digest, {field: value}]


class PatternConfigError(ProcessorConfigError):
    """A pattern or pattern processor is declared wrongly (found when the fold is built)."""

    code = "PATTERN_CONFIG"


def default_insights_topic(processor: str) -> str:
    """The default topic of a pattern processor's insights: ``<processor>.insights``."""
    return f"{processor}.insights"


class PatternOptions(ProcessorOptions):
    """A pattern processor's options: the common ones plus where its insights go.

    Attributes:
        insights_topic: Default ``<processor>.insights``.
    """

    insights_topic: str | None = None


def _check(name: str, within_ms: int, severity: str) -> list[str]:
    problems = []
    if not _NAME.match(name):
        problems.append(f"pattern name {name!r} must be lower case letters, digits and _")
    if within_ms < 0:
        problems.append(f"{name}: within_ms must be >= 0")
    if not severity:
        problems.append(f"{name}: severity is empty")
    return problems


def _raise(problems: list[str]) -> None:
    if problems:
        raise PatternConfigError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class Sequence:
    """Its steps in event-time order, the last at most ``within_ms`` after the first.

    Skip-till-next-match: events between the steps are ignored. An event matching the first
    step opens a partial match; each later event moves the oldest partial whose next step it
    matches (an event serves at most one partial; one that serves none and matches the first
    step opens a new one). A partial completes into a match and is consumed; it expires when an
    event beyond its window would be needed. At most ``max_open`` partials per key (the oldest
    is dropped).
    """

    name: str
    steps: tuple[On, ...]
    within_ms: int
    severity: str = "critical"
    description: str = ""
    max_open: int = _MAX_OPEN
    kind: ClassVar[str] = "sequence"

    def __post_init__(self) -> None:
        problems = _check(self.name, self.within_ms, self.severity)
        if len(self.steps) < 2:
            problems.append(f"{self.name}: a sequence needs at least two steps")
        if self.max_open < 1:
            problems.append(f"{self.name}: max_open must be >= 1")
        _raise(problems)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return self.steps

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {"steps": " -> ".join(s.label for s in self.steps), "within_ms": str(self.within_ms)}


@dataclass(frozen=True, slots=True)
class CountWithin:
    """``count`` events matching ``on`` with the last at most ``within_ms`` after the first.

    The events of a match are consumed: counting starts over after it, so 3 cancellations give
    one match, and a 4th needs two more within its own window for the next one (6 within the
    window: two matches). Events older than ``within_ms`` before a new one stop counting.
    """

    name: str
    on: On
    count: int
    within_ms: int
    severity: str = "critical"
    description: str = ""
    kind: ClassVar[str] = "count"

    def __post_init__(self) -> None:
        problems = _check(self.name, self.within_ms, self.severity)
        if self.count < 1:
            problems.append(f"{self.name}: count must be >= 1")
        _raise(problems)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return (self.on,)

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {"on": self.on.label, "count": str(self.count), "within_ms": str(self.within_ms)}


@dataclass(frozen=True, slots=True)
class Absence:
    """An ``after`` event not followed by any ``expect`` event within ``within_ms``.

    Each ``after`` at ``t`` arms a deadline at ``t + within_ms``. An ``expect`` event at a time
    in ``[t, t + within_ms]`` disarms it (every deadline armed when it comes). A deadline fires,
    once the watermark is above it, as a match detected at the deadline. An event that is both
    is an ``expect`` first. At most ``max_open`` armed deadlines per key (the oldest is
    dropped).
    """

    name: str
    after: On
    expect: On | tuple[On, ...]
    within_ms: int
    severity: str = "critical"
    description: str = ""
    max_open: int = _MAX_OPEN
    kind: ClassVar[str] = "absence"

    def __post_init__(self) -> None:
        if isinstance(self.expect, On):
            object.__setattr__(self, "expect", (self.expect,))
        problems = _check(self.name, self.within_ms, self.severity)
        if not self.expect:
            problems.append(f"{self.name}: an absence needs at least one expected event")
        if self.max_open < 1:
            problems.append(f"{self.name}: max_open must be >= 1")
        _raise(problems)

    @property
    def expected(self) -> tuple[On, ...]:
        """The events that disarm it."""
        return self.expect if isinstance(self.expect, tuple) else (self.expect,)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return (self.after, *self.expected)

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {
            "after": self.after.label,
            "expect": " | ".join(e.label for e in self.expected),
            "within_ms": str(self.within_ms),
        }


Pattern = Sequence | CountWithin | Absence
_Match = tuple[int, int, list[str], dict[str, str]]  # detected_at, first_at, refs, details


def _run_sequence(
    p: Sequence, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[_Match]]:
    """Partials are ``[start, next step, [refs]]``, oldest first."""
    partials = [list(x) for x in open_]
    found: list[_Match] = []
    for t, event_type, ref, _digest, fields in events:
        partials = [x for x in partials if t - x[0] <= p.within_ms]
        taken = False
        for i, (start, step, refs) in enumerate(partials):
            if p.steps[step].matches(event_type, fields):
                taken = True
                if step + 1 == len(p.steps):
                    found.append((t, start, [*refs, ref], {}))
                    del partials[i]
                else:
                    partials[i] = [start, step + 1, [*refs, ref]]
                break
        if not taken and p.steps[0].matches(event_type, fields):
            partials = [*partials, [t, 1, [ref]]][-p.max_open :]
    # No event at or above the watermark can complete a partial whose window ends below it.
    return [x for x in partials if x[0] + p.within_ms >= watermark], found


def _run_count(
    p: CountWithin, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[_Match]]:
    """Counted events are ``[time, ref]``, oldest first (fewer than ``count``)."""
    recent = [list(x) for x in open_]
    found: list[_Match] = []
    for t, event_type, ref, _digest, fields in events:
        if not p.on.matches(event_type, fields):
            continue
        recent = [x for x in recent if t - x[0] <= p.within_ms]
        recent.append([t, ref])
        if len(recent) >= p.count:
            found.append((t, recent[0][0], [r for _t, r in recent], {}))
            recent = []
    return [x for x in recent if x[0] + p.within_ms >= watermark], found


def _run_absence(
    p: Absence, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[_Match]]:
    """Armed deadlines are ``[deadline, after time, ref]``, in deadline order."""
    armed = [list(x) for x in open_]
    found: list[_Match] = []
    expect_at: int | None = None  # the latest expect settled in this pass

    def fire_below(limit: int) -> None:
        while armed and armed[0][0] < limit:
            deadline, at, ref = armed.pop(0)
            found.append((deadline, at, [ref], {"deadline": str(deadline)}))

    for t, event_type, ref, _digest, fields in events:
        fire_below(t)  # an expect exactly at a deadline still counts: events at t come first
        if any(e.matches(event_type, fields) for e in p.expected):
            armed, expect_at = [], t
        # An expect at the same time as the after disarms it, whichever sorts first. One
        # pass settles every event of a time together, so expect_at never outlives it.
        if p.after.matches(event_type, fields) and expect_at != t:
            armed = [*armed, [t + p.within_ms, t, ref]][-p.max_open :]
    fire_below(watermark)
    return armed, found


class PatternProjection:
    """An entity fold that matches patterns per key and emits insights (see the module doc).

    State per key (JSON): ``buffer`` (unsettled events, sorted), ``open`` (per pattern, its
    partial sequences, counted events or armed deadlines), ``insights`` (matches so far per
    pattern), ``seen`` (the newest event time folded). A key with nothing open and no
    insights is deleted once the watermark passes its newest event.

    Args:
        name: The processor's name (also in every insight and its id).
        key: The event field holding the key (the topics' partition key).
        event_types: Every event type on its topics (the ones no pattern names still move the
            watermark and are otherwise ignored).
        event_time: The spec's event time (which field holds each type's time).
        patterns: The patterns, matched independently of each other.
        table: The state table.
        aggregate: The aggregate hash: ``insights``, ``insights:<pattern>``, ``buffered``
            (unsettled events) and ``open:<pattern>``.
        insights_topic: Default ``<name>.insights``.

    Raises:
        PatternConfigError: No event time, no patterns, duplicate pattern names, or a pattern
            naming an event type not in ``event_types``.
    """

    def __init__(
        self,
        name: str,
        *,
        key: str,
        event_types: Iterable[str],
        event_time: EventTime | None,
        patterns: Iterable[Pattern],
        table: str = "patterns",
        aggregate: str = "insight_counts",
        insights_topic: str | None = None,
    ) -> None:
        self.name = name
        self.key_field = key
        self.event_types = tuple(event_types)
        if event_time is None:
            msg = f"{name}: a pattern processor needs an event time (its spec's event_time)"
            raise PatternConfigError(msg)
        self.event_time = event_time
        self.patterns = tuple(patterns)
        self.table = table
        self.aggregate = aggregate
        self.insights_topic = insights_topic or default_insights_topic(name)
        names = [p.name for p in self.patterns]
        problems = [] if names else [f"{name}: no patterns"]
        problems += [
            f"{name}: pattern {n!r} is declared twice"
            for n in sorted(set(names))
            if names.count(n) > 1
        ]
        for pattern in self.patterns:
            problems += [
                f"{name}: pattern {pattern.name!r} matches {on.event_type}, which is not in "
                "event_types"
                for on in pattern.ons
                if on.event_type not in self.event_types
            ]
        _raise(problems)
        fields: dict[str, set[str]] = {}
        for pattern in self.patterns:
            for on in pattern.ons:
                fields.setdefault(on.event_type, set()).update(on.fields)
        self._fields = {t: tuple(sorted(f)) for t, f in fields.items()}
        self._ons = tuple(dict.fromkeys(on for p in self.patterns for on in p.ons))
        # Steps with a test: judged once per event when it is folded, the verdict buffered.
        self._tested = {
            t: tuple(on for on in self._ons if on.event_type == t and on.test is not None)
            for t in self._fields
        }

    @property
    def effect_topics(self) -> tuple[str, ...]:
        """Where insights go (created at start)."""
        return (self.insights_topic,)

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """The pattern's key."""
        del event_type
        return str(event[self.key_field])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Buffer the event if a pattern may use it; matching waits for the watermark."""
        at = event_time_ms(event, self.event_time.field_of(event_type))
        current = state or {
            "key": str(event[self.key_field]),
            "buffer": [],
            "open": {},
            "insights": {},
            "seen": at,
        }
        new = {**current, "seen": max(current["seen"], at)}
        if event_type not in self._fields:
            return new
        fields = {f: canonical(event.get(f)) for f in self._fields[event_type]}
        for on in self._tested[event_type]:
            fields[on.test_key] = on.judge(event)
        if not any(on.matches(event_type, fields) for on in self._ons):
            return new
        entry = [at, event_type, *self._identity(event_type, event, at), fields]
        buffer = current["buffer"]
        index = bisect.bisect_left(buffer, entry[:4], key=lambda e: e[:4])
        if index < len(buffer) and buffer[index][:4] == entry[:4]:
            return new  # a duplicate (the same event again): already buffered
        return {**new, "buffer": [*buffer[:index], entry, *buffer[index:]]}

    def due(self, state: State) -> int | None:
        """One millisecond after the earliest unsettled event, expiry or deadline.

        With nothing open: one after the newest event (the key is then deleted), or none when
        the key keeps insight counts.
        """
        times: list[int] = [e[0] for e in state["buffer"][:1]]
        for pattern in self.patterns:
            open_ = state["open"].get(pattern.name, ())
            if isinstance(pattern, Absence):
                times += [d for d, _at, _ref in open_[:1]]
            else:  # a partial's or a counted event's window end
                times += [x[0] + pattern.within_ms for x in open_[:1]]
        if times:
            return min(times) + 1
        return None if state["insights"] else int(state["seen"]) + 1

    def on_timer(self, state: State, watermark: int) -> State | None:
        """Settle what is below the watermark; ``None`` when nothing is left to keep."""
        after, _insights = self._settle(state, watermark)
        return after

    def effects(
        self, event_type: str, event: Mapping[str, Any], before: State | None, after: State
    ) -> list[SideEffect]:
        """The insights a timer found, on the insights topic with the ``Insight`` contract.

        They are found again from ``before`` and the watermark (pure and cheap), so the state
        keeps no copy of them.
        """
        del after
        if event_type != TIMER_EVENT or before is None:
            return []
        _after, insights = self._settle(before, int(event["watermark"]))
        return [
            SideEffect(self.insights_topic, str(i["key"]), i, contract=INSIGHT) for i in insights
        ]

    def contribution(self, state: State) -> Mapping[str, int]:
        """Insights per pattern and in all, unsettled events, open matches per pattern."""
        counts: dict[str, int] = state["insights"]
        out = {f"insights:{p}": n for p, n in counts.items()}
        out["insights"] = sum(counts.values())
        out["buffered"] = len(state["buffer"])
        out.update({f"open:{p}": len(v) for p, v in state["open"].items()})
        return out

    def _identity(self, event_type: str, event: Mapping[str, Any], at: int) -> tuple[str, str]:
        """The event's reference in insights and, without an event id, a digest of its content.

        ``(time, type, ref, digest)`` orders a key's events the same in every run and tells
        a repeated event (an upstream's at-least-once output) from another.
        """
        event_id = event.get("event_id")
        if event_id is not None:
            return str(event_id), ""
        content = orjson.dumps(canonical(event), option=orjson.OPT_SORT_KEYS)
        return f"{event_type}@{at}", hashlib.blake2b(content, digest_size=8).hexdigest()

    def _settle(self, state: State, watermark: int) -> tuple[State | None, list[dict[str, Any]]]:
        buffer = state["buffer"]
        cut = bisect.bisect_left(buffer, watermark, key=lambda e: e[0])
        settled, rest = buffer[:cut], buffer[cut:]
        opened: dict[str, list[Any]] = {}
        counts = dict(state["insights"])
        insights: list[dict[str, Any]] = []
        for pattern in self.patterns:
            open_ = state["open"].get(pattern.name, [])
            if isinstance(pattern, Sequence):
                open_, found = _run_sequence(pattern, open_, settled, watermark)
            elif isinstance(pattern, CountWithin):
                open_, found = _run_count(pattern, open_, settled, watermark)
            else:
                open_, found = _run_absence(pattern, open_, settled, watermark)
            if open_:
                opened[pattern.name] = open_
            if found:
                counts[pattern.name] = counts.get(pattern.name, 0) + len(found)
                insights += self._insights(pattern, str(state["key"]), found)
        new = {**state, "buffer": rest, "open": opened, "insights": counts}
        if not rest and not opened and not counts and state["seen"] < watermark:
            return None, insights
        return new, insights

    def _insights(self, pattern: Pattern, key: str, found: list[_Match]) -> list[dict[str, Any]]:
        """The matches as insight records, numbered per detection time.

        Every match of one detection time is found in one settling pass (its events, or its
        deadline, are all below the same first watermark above it), so the numbers are the
        same in every run.
        """
        out = []
        seen: dict[int, int] = {}
        for detected_at, first_at, refs, extra in found:
            n = seen[detected_at] = seen.get(detected_at, -1) + 1
            details = {**pattern.details(), **extra}
            if pattern.description:
                details["description"] = pattern.description
            out.append(
                {
                    "insight_id": f"{self.name}/{pattern.name}/{key}/{detected_at}/{n}",
                    "processor": self.name,
                    "pattern": pattern.name,
                    "kind": pattern.kind,
                    "key": key,
                    "severity": pattern.severity,
                    "detected_at": detected_at,
                    "first_at": first_at,
                    "event_count": len(refs),
                    "events": refs,
                    "details": details,
                }
            )
        return out
