"""Scans of a table in pages, pinned to one generation.

A cursor names the generation the scan started on, the shard it is in and Redis's SCAN cursor
within that shard, so a scan that a replay's flip interrupts goes on reading the generation it
began with (a retired generation keeps its keys until ``replay gc``): every entity of that
generation is returned, none twice while its keyspace does not shrink (Redis SCAN's guarantee;
only ``gc`` shrinks it), and none from another generation. A cursor whose generation was removed
answers 410: start again.

A sharded generation (``GenerationKeys.shards``) keeps each partition id's entities under its
shard's hash tag: a scan walks the shards one after the other, each to its end (on a Redis
Cluster, on the master that owns the shard's slot), so a page may end in one shard and the next
begin in the following one. The shards are disjoint, so the guarantees above hold shard by shard
and so for the whole scan. An unsharded generation is one shard, 0.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, cast

import orjson

from refold.contracts.layout import GenerationKeys
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.scan import scan_page as scan_round
from refold.services.api.errors import ApiError

__all__ = ["Page", "ScanCursor", "scan_page"]

_VERSION = "c1."
# SCAN calls per page at most: a small table in a large database gives short (even empty) pages
# with a next_cursor rather than one long request (the route runs on the event loop).
_MAX_ROUNDS = 20
_MAX_CURSOR = 2**64  # Redis SCAN cursors are unsigned 64-bit


def _invalid() -> ApiError:
    msg = "not a cursor of this scan: pass next_cursor on exactly as it was returned"
    return ApiError(400, "CURSOR_INVALID", msg)


@dataclass(frozen=True, slots=True)
class ScanCursor:
    """Where a scan is: processor, table, generation, shard and Redis's SCAN cursor in it."""

    processor: str
    table: str
    generation: int
    position: int
    shard: int = 0

    def encode(self) -> str:
        """Opaque, URL-safe text."""
        body = orjson.dumps(
            [self.processor, self.table, self.generation, self.position, self.shard]
        )
        return _VERSION + base64.urlsafe_b64encode(body).rstrip(b"=").decode()

    @classmethod
    def decode(cls, text: str, processor: str, table: str) -> ScanCursor:
        """Read a cursor this scan returned (one without a shard, as before shards: shard 0).

        Raises:
            ApiError: 400 when it is not one, or belongs to another processor or table.
        """
        raw = text[len(_VERSION) :]
        try:
            if not text.startswith(_VERSION):
                raise ValueError(text)
            name, tab, generation, position, *shard = orjson.loads(
                base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
            )
            if len(shard) > 1:
                raise ValueError(text)
            cursor = cls(str(name), str(tab), int(generation), int(position), int(*shard or [0]))
            if not (
                0 <= cursor.position < _MAX_CURSOR
                and 0 < cursor.generation < _MAX_CURSOR
                and 0 <= cursor.shard < _MAX_CURSOR
            ):
                raise ValueError(text)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise _invalid() from exc
        if (cursor.processor, cursor.table) != (processor, table):
            msg = (
                f"this cursor belongs to a scan of {cursor.processor}/{cursor.table}, not "
                f"{processor}/{table}"
            )
            raise ApiError(400, "CURSOR_INVALID", msg)
        return cursor


@dataclass(frozen=True, slots=True)
class Page:
    """One page: entities, the generation they are from, and the cursor of the next page."""

    generation: int
    items: list[tuple[str, Any]]
    next_cursor: str | None


def scan_page(
    registry: GenerationRegistry,
    table: str,
    cursor: ScanCursor,
    limit: int,
) -> Page:
    """About ``limit`` entities from ``cursor`` on (SCAN's COUNT is a hint; a page may be short).

    Args:
        registry: The processor's registry (keep one: it reads a generation's shards once).
        table: The table.
        cursor: Where the scan is.
        limit: The page size aimed at.

    Raises:
        ApiError: 410 when the cursor's generation has been removed; 400 when it names a shard
            the generation does not have.
    """
    layout, client = registry.layout, registry.client
    if registry.status(cursor.generation) is None:
        msg = (
            f"generation {cursor.generation} of {layout.processor}, which this scan began on, "
            "has been removed (replay gc). Start the scan again without a cursor."
        )
        raise ApiError(410, "CURSOR_EXPIRED", msg)
    shards = registry.keys(cursor.generation).each_shard()
    if cursor.shard >= len(shards):
        raise _invalid()
    shard, position = cursor.shard, cursor.position
    found: list[tuple[GenerationKeys, list[bytes]]] = []  # names per shard, in scan order
    count = 0
    for _round in range(_MAX_ROUNDS):
        keys = shards[shard]
        position, names = scan_round(client, position, keys.table_pattern(table), max(limit, 10))
        if names:
            found.append((keys, names))
            count += len(names)
        if position == 0:  # this shard is done: the next one, from its start
            shard += 1
            if shard == len(shards) or count >= limit:
                break
        elif count >= limit:
            break
    items: list[tuple[str, Any]] = []
    for keys, names in found:  # one MGET per shard: its keys share a slot
        prefix = keys.table(table, "")
        values = cast("list[bytes | None]", client.mget(names))
        items += [
            (name.decode()[len(prefix) :], orjson.loads(raw))
            for name, raw in zip(names, values, strict=True)
            if raw is not None
        ]
    following = (
        None
        if shard == len(shards)
        else ScanCursor(layout.processor, table, cursor.generation, int(position), shard).encode()
    )
    return Page(cursor.generation, items, following)
