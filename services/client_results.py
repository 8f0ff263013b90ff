"""What :class:`~refold.services.client.RefoldClient` returns: deliveries, entities, pages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Aggregate",
    "Delivery",
    "Entities",
    "Entity",
    "IngestResult",
    "Page",
    "Windows",
    "delivery_of",
]


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where the broker wrote one ingested event."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class IngestResult:
    """The answer to an ingest request.

    Attributes:
        accepted: Events written (all of the request's).
        deliveries: Where each was written, in request order.
        consistency_token: Pass it to a query to read these writes (``consistency_token=``).
        idempotency_key: The request's ``Idempotency-Key`` (send it again to retry it).
        replayed: The answer is the one recorded for an earlier request with this key: that
            request produced the events, this one produced nothing.
    """

    accepted: int
    deliveries: tuple[Delivery, ...]
    consistency_token: str
    idempotency_key: str = ""
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Entity:
    """One entity's state, and how fresh it is.

    Attributes:
        key: The entity's key.
        value: Its state (decoded JSON).
        processor: The processor that holds it.
        generation: The generation it was read from (never a mix of two).
        positions: What that generation had applied: ``"<topic>/<partition>"`` -> next offset.
        etag: The response's ETag (None if the server sent none).
    """

    key: str
    value: Any
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Entities:
    """A batch get: each key's state, or None where the table has no such entity."""

    values: Mapping[str, Any]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan; ``next_cursor`` is None on the last page."""

    items: tuple[tuple[str, Any], ...]
    next_cursor: str | None
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Aggregate:
    """An aggregate's counters."""

    name: str
    counters: Mapping[str, int]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows of one group ending in a time range, oldest first.

    Attributes:
        window: The window's name.
        group: The group.
        results: One result per window with data: ``start``, ``end``, ``count``, and per
            measure ``sum:``, ``min:``, ``max:``, ``avg:``, ``distinct:`` (as the processor
            emits it when the window closes).
    """

    window: str
    group: str
    results: tuple[Mapping[str, Any], ...]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


def delivery_of(item: Mapping[str, Any]) -> Delivery:
    """A delivery from its JSON."""
    return Delivery(str(item["topic"]), int(item["partition"]), int(item["offset"]))
