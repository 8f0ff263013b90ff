"""Errors of the services layer (producer SDK, reader)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from refold.contracts.errors import RefoldError

__all__ = [
    "NoLiveGenerationError",
    "PublishError",
    "ServiceError",
    "StateRebuildingError",
    "UnacknowledgedEvent",
    "UnknownWindowError",
    "WindowQueryError",
]


class ServiceError(RefoldError):
    """Base of the services' errors."""

    code = "SERVICE_ERROR"


@dataclass(frozen=True, slots=True)
class UnacknowledgedEvent:
    """One event of a publish call that the broker did not acknowledge.

    Attributes:
        index: Position of the event in the call's input (``0`` for ``emit``).
        event_type: The event's record name.
        topic: The topic it was meant for.
        key: Its message key (the aggregate id).
        event_id: Its ``event_id`` field, when the event has one.
        error: What librdkafka reported for it (e.g. ``Local: Purged in flight``), if anything.
        event: The event itself, so that a caller can retry it (left out of the repr).
    """

    index: int
    event_type: str
    topic: str
    key: str
    event_id: str | None
    error: str | None
    event: Mapping[str, Any] = field(repr=False, compare=False)

    def describe(self) -> str:
        """One line for error messages: index, type, topic, key, event_id and error."""
        text = f"#{self.index} {self.event_type} to {self.topic} key {self.key!r}"
        if self.event_id is not None:
            text += f" event_id {self.event_id!r}"
        if self.error is not None:
            text += f" ({self.error})"
        return text


class PublishError(ServiceError):
    """The broker did not acknowledge one or more events of a publish call in time.

    The call's other events were acknowledged (written with acks=all). The unacknowledged ones
    were purged from the producer, so this producer will not deliver them later; but each of
    them may or may not have been written already: a purged request that was in flight may
    still have reached the broker, and librdkafka may have sent an event once before retrying
    it. Retrying such an event can therefore write it twice. Nothing in refold deduplicates by
    ``event_id`` today (a processor applies each record once by its offset), so a duplicate is
    folded again; retry only events for which that is harmless, or check first whether they
    landed.

    Attributes:
        unacknowledged: The events that were not acknowledged, in input order.
        delivered: Per event of the call, in input order, ``(topic, partition, offset)`` where
            it was written, or None if it was not acknowledged (or not reached).
    """

    code = "PUBLISH_FAILED"
    # The broker may answer again (retriable), subject to the duplicate caveat above.
    retriable = True

    def __init__(
        self,
        message: str,
        unacknowledged: Sequence[UnacknowledgedEvent] = (),
        delivered: Sequence[tuple[str, int, int] | None] = (),
    ) -> None:
        super().__init__(message)
        self.unacknowledged: list[UnacknowledgedEvent] = list(unacknowledged)
        self.delivered: list[tuple[str, int, int] | None] = list(delivered)


class NoLiveGenerationError(ServiceError):
    """A reader asked for a processor that has no live generation yet."""

    code = "NO_LIVE_GENERATION"


class StateRebuildingError(ServiceError):
    """A read of a generation that is still catching up from far behind the log (rebuilding).

    The processor started the generation from nothing (its first start, or Redis restarted
    empty) and has not folded the log up to where it ended when it started: an entity may be
    missing or an older version of itself. Ask again later (``retry_after_s``). A generation in
    normal operation, however far behind, never raises this
    (:mod:`refold.contracts.store.catch_up`).

    Attributes:
        processor: The processor.
        generation: The generation read.
        positions: What it had applied when read (the partitions read).
        behind: Per partition it is still behind: the offset it must reach (``{}`` when it has
            not recorded where it starts yet).
        retry_after_s: When to ask again.
    """

    code = "REBUILDING"
    retriable = True

    def __init__(
        self,
        processor: str,
        generation: int,
        positions: Mapping[tuple[str, int], int],
        behind: Mapping[tuple[str, int], int],
        retry_after_s: int = 1,
    ) -> None:
        self.processor = processor
        self.generation = generation
        self.positions = dict(positions)
        self.behind = dict(behind)
        self.retry_after_s = retry_after_s
        if behind:
            where = ", ".join(
                f"{t}/{p} at {self.positions.get((t, p), 0)} of {o}"
                for (t, p), o in sorted(behind.items())[:5]
            )
            state = f"is rebuilding from the log ({where})"
        else:
            state = "is starting to rebuild from the log (it has applied nothing yet)"
        super().__init__(
            f"{processor} g{generation} {state}: its state is not complete yet, ask again in "
            f"{retry_after_s} s"
        )


class WindowQueryError(ServiceError):
    """A window read asked for what the processor does not keep, or for too much at once.

    E.g. a window ending where none of its windows ends, a distinct measure it does not count,
    or a range wider than the reader's bucket budget.
    """

    code = "WINDOW_QUERY_INVALID"


class UnknownWindowError(WindowQueryError):
    """A window read named a window the processor does not declare."""

    code = "WINDOW_UNKNOWN"
