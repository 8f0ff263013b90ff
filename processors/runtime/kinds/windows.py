"""Window folds: each record's measures added to its event-time buckets (additive state).

The fold says what one event counts for (:meth:`WindowFold.measure`); the buckets of every
window it falls in get the increments, extremes and sketch entries, and their timers, in the
transaction (:func:`~refold.processors.runtime.window_writes.write_windows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.client import Pipeline

from refold.contracts.processors import EventTime
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import EventRejectedError, Projection
from refold.processors.fold.windows import (
    WindowCells,
    WindowDelta,
    WindowFold,
    scaled,
    scales_of,
)
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, PendingRecord
from refold.processors.runtime.kinds.base import FoldContext
from refold.processors.runtime.output_transactions import Outbox
from refold.processors.runtime.window_writes import write_windows

__all__ = ["WindowKind", "is_window_fold"]


def is_window_fold(projection: Projection) -> bool:
    """A fold that declares windows."""
    return bool(getattr(projection, "windows", None))


class _StagedWindows:
    def __init__(self, context: FoldContext, delta: WindowDelta) -> None:
        self.context = context
        self.delta = delta

    def send_effects(self, outbox: Outbox) -> None:
        """Window folds have no side effects (their results are emitted when windows close)."""

    def write(self, pipe: Pipeline) -> None:
        write_windows(pipe, self.context.target.keys, self.delta)


class WindowKind:
    """The kind of a :class:`WindowFold`."""

    keyed = False

    def __init__(self, context: FoldContext) -> None:
        if context.target.event_time is None:
            msg = f"{context.target.processor}: a window processor needs an event time"
            raise ValueError(msg)
        self.context = context
        self.fold = cast("WindowFold", context.projection)
        self.scales = scales_of(context.projection)

    def stage(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        watermarks: Sequence[int | None],
        dead: list[DeadLetter],
        outcome: BatchOutcome,
    ) -> _StagedWindows:
        """Add each record's measures to its buckets, in memory."""
        event_time = cast("EventTime", self.context.target.event_time)
        cells = WindowCells(self.fold.windows)
        fields: dict[str, str] = {}  # event type -> its event-time field
        for record, event_type, data, _entity in pending:
            try:
                measures = [scaled(m, self.scales) for m in self.fold.measure(event_type, data)]
            except EventRejectedError as exc:
                dead.append(DeadLetter(record, "rejected", str(exc)))
                continue
            except Exception as exc:  # user code: one record's failure must not stop the stream
                dead.append(DeadLetter(record, "fold-error", f"measure() raised {exc!r}"))
                continue
            field_name = fields.get(event_type)
            if field_name is None:
                field_name = fields[event_type] = event_time.field_of(event_type)
            at = event_time_ms(data, field_name)
            for measure in measures:
                cells.add(at, measure)
            outcome.applied += 1
        return _StagedWindows(self.context, cells.delta(event_time.retention_ms))
