"""The contract between a processor's pure fold and the Spark/Redis machinery around it.

A :class:`Projection` is plain Python: no Spark, no Redis, no I/O. The sink calls it on
executors; the tests' oracle and the benchmark baseline call the same object in one process, so
"live state == oracle" compares the wiring, not two copies of the logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts.errors import RefoldError

__all__ = [
    "EventRejectedError",
    "FoldResult",
    "Projection",
    "SideEffect",
    "State",
    "effects_of",
    "fold_all",
]

State = dict[str, Any]


class EventRejectedError(RefoldError):
    """The fold refuses an event (it breaks a domain rule); the event goes to the dead letters."""

    code = "EVENT_REJECTED"


@dataclass(frozen=True, slots=True)
class SideEffect:
    """Something a fold asks of the outside world: a JSON record on an output topic.

    A projection that has side effects defines ``effects(event_type, event, before, after)``
    returning them for one applied event, and ``effect_topics`` naming the topics (created at
    start). The sink produces them before it commits the state, like dead letters: at least
    once, with the origin record in the headers for consumers that deduplicate. A generation
    that ``replay`` is building does not produce those of records the live generation has
    already applied (they were produced then); it counts them as suppressed.
    """

    topic: str
    key: str
    value: Mapping[str, Any]


class Projection(Protocol):
    """A pure fold of events into one state per entity, plus integer aggregates.

    Implementations must be picklable (shipped to Spark executors) and deterministic. Side
    effects are optional (see :class:`SideEffect`).
    """

    @property
    def name(self) -> str:
        """Processor name: Redis keys, consumer group and dead-letter topic derive from it."""
        ...

    @property
    def table(self) -> str:
        """Name of the per-entity state table."""
        ...

    @property
    def aggregate(self) -> str:
        """Name of the aggregate hash maintained from the entity states."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types this projection folds; others are dead-lettered."""
        ...

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """The entity an event belongs to."""
        ...

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Return the entity's new state; never mutate ``state``.

        Raises:
            EventRejectedError: The event is not valid for this state.
        """
        ...

    def contribution(self, state: State) -> Mapping[str, int]:
        """What one entity state adds to the aggregate counters.

        The sink applies ``contribution(new) - contribution(old)`` per changed entity, so the
        aggregate always equals the sum over all entities.
        """
        ...


def effects_of(
    projection: Projection,
    event_type: str,
    event: Mapping[str, Any],
    before: State | None,
    after: State,
) -> list[SideEffect]:
    """The side effects of one applied event (none when the projection declares none)."""
    effects = getattr(projection, "effects", None)
    return [] if effects is None else list(effects(event_type, event, before, after))


@dataclass(slots=True)
class FoldResult:
    """States, aggregates and rejections from folding a sequence of events in one process."""

    states: dict[str, State] = field(default_factory=dict)
    aggregate: Counter[str] = field(default_factory=Counter)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def fold_all(projection: Projection, events: Iterable[tuple[str, Mapping[str, Any]]]) -> FoldResult:
    """Fold events (in log order per entity) the plain way: the oracle.

    Args:
        projection: The fold.
        events: ``(event_type, event)`` pairs.

    Returns:
        Final states by entity key, the aggregate (zero counters dropped) and rejected
        ``(event_id-or-key, reason)`` pairs.
    """
    result = FoldResult()
    for event_type, event in events:
        if event_type not in projection.event_types:
            result.rejected.append((str(event.get("event_id")), f"unknown type {event_type}"))
            continue
        key = projection.key(event_type, event)
        try:
            result.states[key] = projection.apply(result.states.get(key), event_type, event)
        except EventRejectedError as exc:
            result.rejected.append((str(event.get("event_id", key)), str(exc)))
    for state in result.states.values():
        result.aggregate.update(projection.contribution(state))
    result.aggregate = Counter({k: v for k, v in result.aggregate.items() if v != 0})
    return result
