"""Event-time timers of entity folds: per-entity due times fired by the partition's watermark.

Pure. An entity fold with an event time may declare two more methods:

- ``due(state) -> int | None``: the event time (ms) at which the entity needs attention (a
  session's end plus its gap, a search's click window end); ``None``: no timer.
- ``on_timer(state, watermark) -> State | None``: called once the watermark has reached the due
  time; returns the new state (``None`` deletes the entity). Its side effects come from
  ``effects(TIMER_EVENT, {"watermark": w}, before, after)`` like any event's.

**Which watermark.** Co-partitioned, an entity lives on one partition id (of each of its
topics), so its timers fire on that partition group's watermark: the minimum over the
processor's topics of their clocks at that partition id, minus the allowed lateness; until every
topic has seen an event at that partition id, no timer of the group fires. Re-keyed (writer
slots), an entity's events may come from any partition, so a slot's entities form one group
whose watermark is the minimum over *every* partition's clock as that slot has seen it
(``GroupClocks(..., partitions=...)``), and the slot fires at every record it reads that moves
a clock (its own before folding them, the other slots' as ticks). Either way it moves record by
record in log order.

**The contract that makes it exact.** Every record folded after a timer fired has an event time
at or above the watermark that fired it (it is on time), so ``on_timer`` must only settle what
no such record can change any more: the parts of the state whose times are below the
watermark. Then live state, the oracle and every replay agree whatever the micro-batch
boundaries and however the topics interleave.

**Where it fires is not batch-independent, what it leaves is.** With several partitions in a
group, which record a timer fires at depends on how their records interleave (one micro-batch
holds more of one partition than another), so no rule over a cross-partition watermark can fix
the firing record. What is fixed: the group's watermark at a writer's positions is a function
of those positions (each clock is its partition's up to them), every timer due at or below it
has fired there (every clock-moving record is a firing point), and the contract above makes
the states at those positions the same whichever records the timers fired at
(docs/event-time.md, "Timers on re-keyed processors").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast

from refold.contracts.layout import parse_position_field
from refold.processors.fold.projection import State

__all__ = [
    "TIMER_EVENT",
    "GroupClocks",
    "TimedFold",
    "TimerQueue",
    "has_timers",
    "timed",
    "timer_event",
]

TIMER_EVENT = "refold.timer"  # the event type ``effects`` sees for a fired timer


class TimedFold(Protocol):
    """The two methods an entity fold adds to have timers."""

    def due(self, state: State) -> int | None:
        """When the entity's timer is due (event time, ms), or ``None``."""
        ...

    def on_timer(self, state: State, watermark: int) -> State | None:
        """The entity's state once the watermark has reached its due time (None: delete)."""
        ...


def has_timers(projection: object) -> bool:
    """True when ``projection`` declares ``due`` and ``on_timer``."""
    return callable(getattr(projection, "due", None)) and callable(
        getattr(projection, "on_timer", None)
    )


def timed(projection: object) -> TimedFold:
    """``projection`` as a :class:`TimedFold` (checked with :func:`has_timers`)."""
    return cast("TimedFold", projection)


class GroupClocks:
    """The watermark of each partition group from its topics' clocks.

    Args:
        topics: The processor's topics.
        lateness_ms: The allowed lateness.
        clocks: ``topic/partition`` -> largest event time seen (moved record by record by the
            caller through :meth:`advance`).
        partitions: Re-keyed: every ``topic/partition`` the processor reads. Then there is one
            group (``0``), and its watermark is over all of them; ``None``: a group per
            partition id, over the topics' partitions of that id (co-partitioned).
    """

    def __init__(
        self,
        topics: Iterable[str],
        lateness_ms: int,
        clocks: Mapping[str, int],
        partitions: Iterable[str] | None = None,
    ) -> None:
        self.topics = tuple(topics)
        self.lateness_ms = lateness_ms
        self.clocks: dict[tuple[str, int], int] = {}
        for field, value in clocks.items():
            parsed = parse_position_field(field)
            if parsed is not None:
                self.clocks[parsed] = value
        self.whole: tuple[tuple[str, int], ...] | None = None
        if partitions is not None:
            parsed_all = (parse_position_field(f) for f in partitions)
            self.whole = tuple(sorted(p for p in parsed_all if p is not None))

    def group_of(self, partition: int) -> int:
        """The group of a record of partition id ``partition``: its id, or ``0`` re-keyed."""
        return partition if self.whole is None else 0

    def advance(self, topic: str, partition: int, at: int | None) -> int | None:
        """Move ``topic/partition``'s clock to ``at``; its group's watermark after it.

        The caller passes the partition's clock after each record (``None``: it has none yet,
        as on a derived partition before its markers: docs/event-time.md, "Across chains").
        """
        current = self.clocks.get((topic, partition))
        if at is not None and (current is None or at > current):
            self.clocks[(topic, partition)] = at
        return self.mark(self.group_of(partition))

    def mark(self, group: int) -> int | None:
        """The watermark of group ``group`` (a partition id; ``0`` re-keyed).

        ``None`` until every partition of the group has seen an event: a partition that has
        not started may still bring events of any time, all on time, which a timer fired
        without it would have missed (a first batch holding all of one topic's backlog and
        none of the other's would close every session early).
        """
        if self.whole is None:
            seen = [self.clocks.get((t, group)) for t in self.topics]
        else:
            seen = [self.clocks.get(tp) for tp in self.whole]
        if not seen or any(clock is None for clock in seen):
            return None
        return min(cast("list[int]", seen)) - self.lateness_ms


class TimerQueue:
    """The due times of the entities of a transaction, per group (partition id, or slot).

    Loaded with the stored timers that may fire, updated as states change; :attr:`changed`
    holds what to write back (``None``: remove). A heap per group makes a record with nothing
    due cost one look at its smallest due time (a re-keyed slot fires at every record).
    """

    def __init__(self) -> None:
        self._due: dict[int, dict[str, int]] = {}
        self._heaps: dict[int, list[tuple[int, str]]] = {}
        self.changed: dict[tuple[int, str], int | None] = {}

    def entities(self) -> set[str]:
        """Every entity with a timer here."""
        return {e for timers in self._due.values() for e in timers}

    def load(self, partition: int, entries: Iterable[tuple[str, int]]) -> None:
        """Stored timers (entity, due) of a group."""
        timers = self._due.setdefault(partition, {})
        heap = self._heaps.setdefault(partition, [])
        for entity, due in entries:
            timers[entity] = due
            heapq.heappush(heap, (due, entity))

    def due_of(self, partition: int, entity: str) -> int | None:
        """The entity's due time in group ``partition`` as loaded or set here (``None``: none)."""
        return self._due.get(partition, {}).get(entity)

    def set(self, partition: int, entity: str, due: int | None) -> None:
        """The entity's new due time (``None``: no timer)."""
        timers = self._due.setdefault(partition, {})
        if timers.get(entity) == due:
            return
        if due is None:
            timers.pop(entity, None)
        else:
            timers[entity] = due
            heapq.heappush(self._heaps.setdefault(partition, []), (due, entity))
        self.changed[(partition, entity)] = due

    def pop_due(self, partition: int, watermark: int | None) -> list[tuple[int, str]]:
        """The timers of group ``partition`` due at ``watermark``, by (due, entity); removed."""
        heap = self._heaps.get(partition)
        if not heap or watermark is None:
            return []
        timers = self._due[partition]
        fired: list[tuple[int, str]] = []
        while heap and heap[0][0] <= watermark:
            due, entity = heapq.heappop(heap)
            if timers.get(entity) == due and (not fired or fired[-1] != (due, entity)):
                fired.append((due, entity))  # else stale: the entity's due moved since
        for _due, entity in fired:
            self.set(partition, entity, None)
        return fired


def timer_event(watermark: int) -> dict[str, Any]:
    """The event ``effects`` sees for a timer fired at ``watermark``."""
    return {"watermark": watermark}
