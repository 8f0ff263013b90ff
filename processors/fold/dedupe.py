"""De-duplication by event id (pure): the ids each entity applied lately, and the rule.

One rule for the live writer and the oracle (:func:`~refold.processors.fold.oracle.fold_all`
with ``dedupe=``): an event whose id is among the ids of the latest ``horizon`` events its
entity applied is passed by, as a duplicate; an applied event's id is remembered, the oldest
forgotten past the horizon. An event without the id field is never a duplicate. Rejected
events are not remembered (they were not applied).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson

from refold.contracts.processors import EventId

__all__ = ["SeenIds"]


class SeenIds:
    """The latest applied event ids of some entities (a batch's, or all of the oracle's)."""

    def __init__(self, dedupe: EventId, ids: Mapping[str, list[str]] | None = None) -> None:
        self.dedupe = dedupe
        self._ids: dict[str, deque[str]] = {
            entity: deque(found, maxlen=dedupe.horizon) for entity, found in (ids or {}).items()
        }
        self._sets = {entity: set(found) for entity, found in self._ids.items()}
        self._changed: set[str] = set()
        self._forgotten: set[str] = set()

    @classmethod
    def load(cls, dedupe: EventId, stored: Mapping[str, bytes | None]) -> SeenIds:
        """From the stored JSON lists (``None``: an entity with none yet)."""
        return cls(dedupe, {e: orjson.loads(raw) for e, raw in stored.items() if raw is not None})

    def _id(self, event: Mapping[str, Any]) -> str | None:
        value = event.get(self.dedupe.field)
        return None if value is None else str(value)

    def is_duplicate(self, entity: str, event: Mapping[str, Any]) -> bool:
        """Whether ``entity`` applied an event with this event's id lately."""
        event_id = self._id(event)
        return event_id is not None and event_id in self._sets.get(entity, ())

    def remember(self, entity: str, event: Mapping[str, Any]) -> None:
        """Record that ``entity`` applied ``event``."""
        event_id = self._id(event)
        if event_id is None:
            return
        ids = self._ids.setdefault(entity, deque(maxlen=self.dedupe.horizon))
        known = self._sets.setdefault(entity, set())
        if len(ids) == ids.maxlen:
            known.discard(ids[0])
        ids.append(event_id)
        known.add(event_id)
        self._changed.add(entity)
        self._forgotten.discard(entity)

    def forget(self, entity: str) -> None:
        """``entity`` is gone (its state expired): its ids are forgotten with it."""
        self._ids.pop(entity, None)
        self._sets.pop(entity, None)
        self._changed.discard(entity)
        self._forgotten.add(entity)

    @property
    def forgotten(self) -> list[str]:
        """The entities whose ids were forgotten (and not remembered again since)."""
        return sorted(self._forgotten)

    @property
    def changed(self) -> bool:
        """Whether any entity remembered a new id."""
        return bool(self._changed)

    def encoded(self) -> dict[str, bytes]:
        """The changed entities' id lists, as stored (JSON)."""
        return {e: orjson.dumps(list(self._ids[e])) for e in sorted(self._changed)}
