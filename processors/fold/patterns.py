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

The pattern kinds and their matching are :mod:`refold.processors.fold.pattern_kinds` (imported
here: ``refold.processors.fold.patterns`` is the path users import them from).

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
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from refold.contracts.insights import INSIGHT
from refold.contracts.processors import EventTime, ProcessorOptions
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
from refold.processors.fold.pattern_kinds import (
    Absence,
    CountWithin,
    Match,
    Pattern,
    PatternConfigError,
    Sequence,
    raise_if_problems,
    run_absence,
    run_count,
    run_sequence,
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


def default_insights_topic(processor: str) -> str:
    """The default topic of a pattern processor's insights: ``<processor>.insights``."""
    return f"{processor}.insights"


class PatternOptions(ProcessorOptions):
    """A pattern processor's options: the common ones plus where its insights go.

    Attributes:
        insights_topic: Default ``<processor>.insights``.
    """

    insights_topic: str | None = None


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
        raise_if_problems(problems)
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
                open_, found = run_sequence(pattern, open_, settled, watermark)
            elif isinstance(pattern, CountWithin):
                open_, found = run_count(pattern, open_, settled, watermark)
            else:
                open_, found = run_absence(pattern, open_, settled, watermark)
            if open_:
                opened[pattern.name] = open_
            if found:
                counts[pattern.name] = counts.get(pattern.name, 0) + len(found)
                insights += self._insights(pattern, str(state["key"]), found)
        new = {**state, "buffer": rest, "open": opened, "insights": counts}
        if not rest and not opened and not counts and state["seen"] < watermark:
            return None, insights
        return new, insights

    def _insights(self, pattern: Pattern, key: str, found: list[Match]) -> list[dict[str, Any]]:
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
