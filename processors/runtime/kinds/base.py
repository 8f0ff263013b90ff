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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import redis
from redis.client import Pipeline

from refold.contracts.layout import GenerationKeys
from refold.processors.fold.projection import Projection
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget, PendingRecord
from refold.processors.runtime.output_transactions import Outbox

__all__ = [
    "BatchKind",
    "FoldContext",
    "KindDiff",
    "StagedBatch",
    "kind_diffs",
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
        self, partitions: Iterable[tuple[str, int]]
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
    """A kind of state: how a chunk of records becomes its changes.

    Attributes:
        keyed: Records go to an entity (the fold's ``key()``), so the writer checks that
            they are on their entity's partition; a kind whose state is additive across
            partitions (windows) or that holds records for later (lookups) is not keyed, and
            cannot be re-keyed.
    """

    keyed: bool

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
# ``replay diff`` of an added kind: its keys in two generations compared, the differing ones
# (named without the generation's base) -> (value in a, value in b).
KindDiff = Callable[[redis.Redis, GenerationKeys, GenerationKeys], Mapping[str, tuple[Any, Any]]]
_KINDS: list[tuple[str, Callable[[Projection], bool], KindFactory]] = []
_DIFFS: dict[str, KindDiff] = {}


def register_kind(
    name: str,
    matches: Callable[[Projection], bool],
    make: KindFactory,
    diff: KindDiff | None = None,
) -> None:
    """Add a kind: the first registered whose ``matches`` accepts a fold is its kind.

    Registering a name again replaces that kind in place. The entity kind accepts every fold
    and is registered first, so a kind added later is asked before it.

    Args:
        name: The kind's name (its keys are ``GenerationKeys.kind_key(name, ...)``).
        matches: Whether a fold is of this kind.
        make: The kind for one writer.
        diff: How ``replay diff`` compares its keys in two generations. The built-in kinds
            are compared by the diff itself (tables, aggregates, buckets, sketches).
    """
    if diff is not None:
        _DIFFS[name] = diff
    for index, (known, _matches, _make) in enumerate(_KINDS):
        if known == name:
            _KINDS[index] = (name, matches, make)
            return
    _KINDS.insert(0, (name, matches, make))


def kind_diffs() -> Iterator[tuple[str, KindDiff]]:
    """The diff of every added kind that has one, by name."""
    yield from sorted(_DIFFS.items())


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
