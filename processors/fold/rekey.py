"""Re-keying: which entity an event belongs to when it is not the topic's partition key (pure).

A processor keyed by another field than its topics' partition key (``customer_stats`` keyed by
``customer_id`` on ``commerce.orders``, partitioned by ``order_id``) still has exactly one
writer per entity: every task of a micro-batch reads the batch's records, and each folds only
the entities of its *slot* (``slot_of(entity)``), under that slot's own guard and positions.

Events that lack the key find it through a :class:`~refold.contracts.processors.KeyLink`: the first
earlier event of the same ``via`` value (the partition key) that carried both fields. Links are
made once and never change, and the ``via`` value lives on one partition, so whether and how an
event resolves depends only on its partition's log up to it: never on batch boundaries, slots or
the order in which partitions are read. :class:`KeyResolver` is that rule; the sink and the
oracle both use it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from refold.contracts.errors import RefoldError

__all__ = [
    "KeyResolver",
    "Keying",
    "KeyingError",
    "Link",
    "decode_link",
    "encode_link",
    "plan_keying",
    "slot_of",
]


def slot_of(entity: str, slots: int) -> int:
    """The writer slot of an entity: CRC-32 of its key (stable across processes and runs)."""
    return zlib.crc32(entity.encode()) % slots


@dataclass(frozen=True, slots=True)
class Link:
    """A made link: ``via`` value -> entity key, made by the record at ``offset``."""

    offset: int
    key: str


def encode_link(link: Link) -> str:
    """A link as stored in Redis: ``<offset>:<key>``."""
    return f"{link.offset}:{link.key}"


def decode_link(raw: bytes | str) -> Link:
    """Inverse of :func:`encode_link`."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    offset, _, key = text.partition(":")
    return Link(int(offset), key)


@dataclass(slots=True)
class KeyResolver:
    """Resolves entity keys in log order per partition, learning links as it goes.

    A re-keyed processor's oracle takes one: ``fold_windows(..., resolver=KeyResolver(
    "customer_id", ("order_id",)))`` (docs/event-time.md, "On re-keyed processors").

    Args:
        key: The entity key field.
        via: The fields whose links lead to ``key`` (an event without ``key`` finds its entity
            through the link an earlier event of its partition made).
        learned: The links learned so far, keyed ``(via field, via value)``; empty to start.

    Lifecycle: one per task (executor) or per oracle run; not shared between threads. Feed it
    each partition's records in offset order. ``stored`` links (from Redis) are trusted only
    when made by a record before the one being resolved.
    """

    key: str
    via: tuple[str, ...] = ()
    learned: dict[tuple[str, str], Link] = field(default_factory=dict)

    def resolve(
        self,
        offset: int,
        event: Mapping[str, Any],
        stored: Mapping[tuple[str, str], Link] | None = None,
        via: tuple[str, ...] | None = None,
    ) -> tuple[str | None, list[tuple[str, str, Link]]]:
        """The entity of the event at ``offset``, and the links it makes.

        Args:
            offset: The record's offset (on its partition).
            event: The decoded event.
            stored: Links read from the store, keyed ``(via field, via value)``.
            via: The link fields usable for this record: those that are its topic's partition
                key (default: all), since a link is only sound within one partition's order.

        Returns:
            The entity key (None when the event has none and no link gives one) and the links
            this event makes, as ``(via field, via value, link)``.
        """
        own = event.get(self.key)
        made: list[tuple[str, str, Link]] = []
        for field_ in self.via if via is None else via:
            value = event.get(field_)
            if value is None:
                continue
            slot = (field_, str(value))
            link = self.link_at(slot, offset, stored)
            if own is not None:
                if link is None:
                    new = Link(offset, str(own))
                    self.learned[slot] = new
                    made.append((field_, str(value), new))
                continue
            if link is not None:
                return link.key, made
        return (None if own is None else str(own)), made

    def link_at(
        self, slot: tuple[str, str], offset: int, stored: Mapping[tuple[str, str], Link] | None
    ) -> Link | None:
        """The link of ``(via field, via value)`` usable by the record at ``offset``, if any."""
        for link in (stored.get(slot) if stored else None, self.learned.get(slot)):
            if link is not None and link.offset < offset:
                return link
        return None


class KeyingError(RefoldError):
    """A processor's key cannot be owned by one writer with the topics it reads."""

    code = "KEYING_INVALID"


@dataclass(frozen=True, slots=True)
class Keying:
    """Who writes an entity: its partition's task (``slots == 0``) or a writer slot.

    Attributes:
        slots: 0 when the processor's topics are co-partitioned by its key; else the number of
            writer slots that own its entities.
        key_field: The entity key field.
        via: Link fields for events without the key.
        partition_keys: ``(topic, partition key field)`` per topic.
        reason: Why, for the start-up log.
    """

    slots: int
    key_field: str
    via: tuple[str, ...]
    partition_keys: tuple[tuple[str, str], ...]
    reason: str


def plan_keying(
    key: str,
    topics: list[tuple[str, str, int]],
    links: list[tuple[str, str]],
    slots: int,
) -> Keying:
    """Decide how a processor's entities get one writer each (checked at start).

    Co-partitioned: every topic is keyed by ``key`` and they have the same partition count
    (the producers' murmur2 partitioner puts a key on the same partition number of each): the
    task of a partition id owns its entities. Otherwise the processor is re-keyed into
    ``slots`` writer slots.

    Args:
        key: The processor's entity key field.
        topics: ``(name, partition key field, partition count)`` per topic, as the broker has
            them now.
        links: ``(via, key)`` links declared by the processor.
        slots: Writer slots when re-keyed (at least 1).

    Raises:
        KeyingError: A link's ``via`` is not the partition key of every topic.
    """
    partition_keys = tuple(sorted((name, field_) for name, field_, _n in topics))
    fields = {field_ for _name, field_, _n in topics}
    counts = {n for _name, _field, n in topics}
    if fields == {key} and len(counts) == 1:
        reason = f"co-partitioned by {key} ({counts.pop()} partitions)"
        return Keying(0, key, (), partition_keys, reason)
    via = tuple(v for v, k in links if k == key)
    for field_ in via:
        if field_ not in fields:
            msg = (
                f"the link {field_} -> {key} needs {field_} to be the partition key of a topic "
                f"it reads; they are partitioned by {', '.join(sorted(fields))}"
            )
            raise KeyingError(msg)
    if fields == {key}:
        reason = f"keyed by {key}, but partition counts differ ({sorted(counts)})"
    else:
        reason = f"keyed by {key}, topics partitioned by {', '.join(sorted(fields))}"
    return Keying(max(1, slots), key, via, partition_keys, f"re-keyed into {slots} slots: {reason}")
