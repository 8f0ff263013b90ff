"""The oracle: a processor's fold run the plain way, in one process, over a list of events.

Built from the same :class:`~processors.fold.projection.Projection` object and the same per-record
checks (:func:`~processors.fold.projection.fold_one`) as the live sink, so "live state ==
oracle" tests the wiring, not two copies of the logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from processors.fold.projection import (
    EventRejectedError,
    Projection,
    State,
    UnstorableStateError,
    fold_one,
)
from processors.fold.rekey import KeyResolver

__all__ = ["FoldResult", "fold_all"]


@dataclass(slots=True)
class FoldResult:
    """States, aggregates and rejections from folding a sequence of events in one process."""

    states: dict[str, State] = field(default_factory=dict)
    aggregate: Counter[str] = field(default_factory=Counter)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def fold_all(
    projection: Projection,
    events: Iterable[tuple[str, Mapping[str, Any]]],
    resolver: KeyResolver | None = None,
) -> FoldResult:
    """Fold events (in log order per entity) the plain way: the oracle.

    Args:
        projection: The fold.
        events: ``(event_type, event)`` pairs, in the order they were published (each
            partition's log order is a sub-sequence of it).
        resolver: For a re-keyed processor with links: resolves each event's entity as the
            live writers do (an event without the key takes its link's), and fills it in.

    Returns:
        Final states by entity key, the aggregate (zero counters dropped) and rejected
        ``(event_id-or-key, reason)`` pairs.
    """
    result = FoldResult()
    for position, (event_type, raw) in enumerate(events):
        event = raw
        if resolver is not None:
            entity, _made = resolver.resolve(position, raw)
            if entity is None:
                result.rejected.append((str(raw.get("event_id")), "key-missing"))
                continue
            if raw.get(resolver.key) is None:
                event = {**raw, resolver.key: entity}
        if event_type not in projection.event_types:
            result.rejected.append((str(event.get("event_id")), f"unknown type {event_type}"))
            continue
        try:
            key = str(projection.key(event_type, event))
        except Exception as exc:  # as the sink: a record without a usable key is refused
            result.rejected.append((str(event.get("event_id")), f"no key: {exc!r}"))
            continue
        try:
            state, _encoded, _contribution, _effects = fold_one(
                projection, result.states.get(key), event_type, event
            )
        except (EventRejectedError, UnstorableStateError) as exc:
            result.rejected.append((str(event.get("event_id", key)), str(exc)))
            continue
        result.states[key] = state
    for state in result.states.values():
        result.aggregate.update(projection.contribution(state))
    result.aggregate = Counter({k: v for k, v in result.aggregate.items() if v != 0})
    return result
