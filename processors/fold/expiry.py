"""State that expires (``state_ttl``), on event time: the pure rule for the writer and the oracle.

An entity's *expiry* is the largest event time it applied plus the TTL
(:class:`~refold.contracts.processors.StateTtl`). It is a timer like an entity fold's own
(:mod:`refold.processors.fold.timers`): kept per timer group (partition id, or re-keyed the
writer slot's one group), fired by the group's watermark at every record that moves it. One
more rule makes the outcome independent of how records interleave: a record whose event time is
at or past its entity's expiry finds the entity expired first (:meth:`Expiries.stale`), whether
or not the watermark got there before it. An on-time record's time is at or above every
watermark that fired a timer before it, so the two ways agree: the entity is removed (counted
once) and the record starts it anew. Live state, the oracle and every replay agree.

At one firing point, the fold's own timers and the expiries fire in due order, an entity's own
timer before its expiry at the same due time (:func:`firing_order`), so one big step of the
watermark does what several small ones do.
"""

from __future__ import annotations

from collections.abc import Iterable

from refold.contracts.processors import StateTtl
from refold.processors.fold.timers import TimerQueue

__all__ = ["Expiries", "firing_order"]


class Expiries:
    """The expiries of the entities of a transaction (or of all of the oracle's), per group.

    Args:
        ttl: The processor's state TTL.

    Attributes:
        queue: The expiries as timers; :attr:`TimerQueue.changed` is what to write back.
    """

    def __init__(self, ttl: StateTtl) -> None:
        self.ttl = ttl
        self.queue = TimerQueue()

    def load(self, group: int, entries: Iterable[tuple[str, int]]) -> None:
        """Stored expiries ``(entity, expiry)`` of a group."""
        self.queue.load(group, entries)

    def stale(self, group: int, entity: str, at: int) -> bool:
        """Whether ``entity`` has expired by event time ``at`` (a record of it at ``at``)."""
        expiry = self.queue.due_of(group, entity)
        return expiry is not None and expiry <= at

    def applied(self, group: int, entity: str, at: int) -> None:
        """``entity`` applied an event at ``at``: its expiry is at least ``at`` + TTL."""
        expiry = self.queue.due_of(group, entity)
        candidate = at + self.ttl.after_ms
        if expiry is None or candidate > expiry:
            self.queue.set(group, entity, candidate)

    def forget(self, group: int, entity: str) -> None:
        """``entity`` is gone (expired, or deleted by its own timer): no expiry."""
        self.queue.set(group, entity, None)

    def pop_due(self, group: int, watermark: int | None) -> list[tuple[int, str]]:
        """The expiries of ``group`` due at ``watermark``, by (expiry, entity); removed."""
        return self.queue.pop_due(group, watermark)

    def entities(self) -> set[str]:
        """Every entity with an expiry here."""
        return self.queue.entities()


def firing_order(
    timers: Iterable[tuple[int, str]], expiries: Iterable[tuple[int, str]]
) -> list[tuple[int, bool, str]]:
    """``(due, is_expiry, entity)`` of the timers and expiries due at one point, in due order.

    An entity's own timer goes before its expiry at the same due time.
    """
    fired = [(due, False, entity) for due, entity in timers]
    fired += [(due, True, entity) for due, entity in expiries]
    return sorted(fired)
