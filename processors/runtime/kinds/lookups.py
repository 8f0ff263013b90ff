"""Lookup folds: each record waits, scored by its event time, for its row of another table.

The record is kept whole in the generation's pending-lookups sorted set, in the transaction;
the joiner (:mod:`refold.processors.runtime.lookup_store`) folds it once the table it looks up
has caught up with its event time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.client import Pipeline

from refold.contracts.processors import EventTime
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.lookups import PENDING_TIMERS, Pending, encode_pending
from refold.processors.fold.projection import Projection
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, PendingRecord
from refold.processors.runtime.kinds.base import FoldContext
from refold.processors.runtime.output_transactions import Outbox

__all__ = ["LookupKind", "is_lookup_fold"]


def is_lookup_fold(projection: Projection) -> bool:
    """A fold that declares a lookup."""
    return bool(getattr(projection, "lookup", None))


class _StagedLookups:
    def __init__(self, context: FoldContext, waiting: dict[bytes, int]) -> None:
        self.context = context
        self.waiting = waiting

    def send_effects(self, outbox: Outbox) -> None:
        """Nothing yet: the joiner sends what the records become once folded."""

    def write(self, pipe: Pipeline) -> None:
        if self.waiting:
            pipe.zadd(self.context.target.keys.timers(PENDING_TIMERS), self.waiting)


class LookupKind:
    """The kind of a :class:`~refold.processors.fold.lookups.LookupFold`."""

    keyed = False

    def __init__(self, context: FoldContext) -> None:
        if context.target.event_time is None:
            msg = f"{context.target.processor}: a lookup processor needs an event time"
            raise ValueError(msg)
        self.context = context

    def stage(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        watermarks: Sequence[int | None],
        dead: list[DeadLetter],
        outcome: BatchOutcome,
    ) -> _StagedLookups:
        """Each record's waiting entry, scored by its event time."""
        event_time = cast("EventTime", self.context.target.event_time)
        waiting: dict[bytes, int] = {}
        for record, event_type, data, _entity in pending:
            at = event_time_ms(data, event_time.field_of(event_type))
            origin = Pending(record.topic, record.partition, record.offset, event_type, data)
            try:
                member = encode_pending(origin)
            except TypeError as exc:  # orjson: a value JSON cannot hold
                dead.append(DeadLetter(record, "unserialisable", f"cannot wait: {exc}"))
                continue
            waiting[member] = at
            outcome.applied += 1
        return _StagedLookups(self.context, waiting)
