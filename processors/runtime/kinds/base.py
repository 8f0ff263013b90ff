"""What a kind of state is to the fold transaction, and the registry that picks a fold's kind.

:meth:`~refold.processors.runtime.envelope.FoldWriter.apply` runs one transaction per chunk:
read the positions, drop what was applied, judge lateness, then hand the records to the fold's
kind of state, send the letters and outputs, and write the kind's changes with the positions in
one MULTI/EXEC. Only the middle differs by kind, and it is all a kind implements:

- :meth:`BatchKind.stage`, before the MULTI: read what the kind needs (WATCHed pipeline in
  immediate mode), fold the records in memory, append the records it refuses to ``dead`` and
  count what it applied in ``outcome``;
- :meth:`StagedBatch.send_effects`, after the batch's letters are queued: queue its side
  effects (entity folds; the others have none);
- :meth:`StagedBatch.write`, inside the MULTI: queue its writes.

A kind is one module that registers itself (:func:`register_kind`) with a test of the fold
("does this projection have windows?") and a factory; the transaction and the runner never ask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from redis.client import Pipeline

from refold.processors.fold.projection import Projection
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget, PendingRecord
from refold.processors.runtime.output_transactions import Outbox

__all__ = [
    "BatchKind",
    "FoldContext",
    "StagedBatch",
    "kind_of",
    "register_kind",
]


class FoldContext(Protocol):
    """What a kind reads of the writer that runs it (the fold envelope's FoldWriter)."""

    @property
    def target(self) -> FoldTarget:
        """Where the generation writes."""
        ...

    @property
    def projection(self) -> Projection:
        """The user's fold."""
        ...

    @property
    def slot(self) -> int | None:
        """The writer slot of a re-keyed processor (None: partitions own the entities)."""
        ...

    def building_against(
        self, pipe: Pipeline, partitions: Iterable[tuple[str, int]]
    ) -> tuple[int | None, dict[str, int]] | None:
        """None unless the generation is building; else the live generation and positions."""
        ...


class StagedBatch(Protocol):
    """A kind's changes for one transaction, folded in memory and not written yet."""

    def send_effects(self, outbox: Outbox) -> None:
        """Queue the side effects in ``outbox`` (after the batch's letters)."""
        ...

    def write(self, pipe: Pipeline) -> None:
        """Queue the writes inside the MULTI."""
        ...


class BatchKind(Protocol):
    """A kind of state: how a chunk of records becomes its changes."""

    def stage(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        watermarks: Sequence[int | None],
        dead: list[DeadLetter],
        outcome: BatchOutcome,
    ) -> StagedBatch:
        """Fold ``pending`` (before the MULTI); ``watermarks``: each record's, or empty."""
        ...


KindFactory = Callable[[FoldContext], BatchKind]
_KINDS: list[tuple[str, Callable[[Projection], bool], KindFactory]] = []


def register_kind(name: str, matches: Callable[[Projection], bool], make: KindFactory) -> None:
    """Add a kind: the first registered whose ``matches`` accepts a fold is its kind.

    Registering a name again replaces that kind in place. The entity kind accepts every fold
    and is registered first, so a kind added later is asked before it.
    """
    for index, (known, _matches, _make) in enumerate(_KINDS):
        if known == name:
            _KINDS[index] = (name, matches, make)
            return
    _KINDS.insert(0, (name, matches, make))


def kind_of(projection: Projection) -> tuple[str, KindFactory]:
    """The name and factory of ``projection``'s kind of state.

    Raises:
        LookupError: No kind accepts it (only when the entity kind was not registered).
    """
    for name, matches, make in _KINDS:
        if matches(projection):
            return name, make
    msg = f"no kind of state accepts {type(projection).__name__}"
    raise LookupError(msg)
