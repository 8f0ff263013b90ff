"""Scans of a table in pages, pinned to one generation.

A cursor names the generation the scan started on and Redis's SCAN cursor within it, so a scan
that a replay's flip interrupts goes on reading the generation it began with (a retired
generation keeps its keys until ``replay gc``): every entity of that generation is returned, none
twice while its keyspace does not shrink (Redis SCAN's guarantee; only ``gc`` shrinks it), and
none from another generation. A cursor whose generation was removed answers 410: start again.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis

from refold.contracts.layout import StateLayout
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.scan import scan_page as scan_round
from refold.services.api.errors import ApiError

__all__ = ["Page", "ScanCursor", "scan_page"]

_VERSION = "c1."
# SCAN calls per page at most: a small table in a large database gives short (even empty) pages
# with a next_cursor rather than one long request (the route runs on the event loop).
_MAX_ROUNDS = 20
_MAX_CURSOR = 2**64  # Redis SCAN cursors are unsigned 64-bit


@dataclass(frozen=True, slots=True)
class ScanCursor:
    """Where a scan is: processor, table, generation and Redis's SCAN cursor."""

    processor: str
    table: str
    generation: int
    position: int

    def encode(self) -> str:
        """Opaque, URL-safe text."""
        body = orjson.dumps([self.processor, self.table, self.generation, self.position])
        return _VERSION + base64.urlsafe_b64encode(body).rstrip(b"=").decode()

    @classmethod
    def decode(cls, text: str, processor: str, table: str) -> ScanCursor:
        """Read a cursor this scan returned.

        Raises:
            ApiError: 400 when it is not one, or belongs to another processor or table.
        """
        raw = text[len(_VERSION) :]
        try:
            if not text.startswith(_VERSION):
                raise ValueError(text)
            name, tab, generation, position = orjson.loads(
                base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
            )
            cursor = cls(str(name), str(tab), int(generation), int(position))
            if not (0 <= cursor.position < _MAX_CURSOR and 0 < cursor.generation < _MAX_CURSOR):
                raise ValueError(text)
        except (binascii.Error, ValueError, TypeError) as exc:
            msg = "not a cursor of this scan: pass next_cursor on exactly as it was returned"
            raise ApiError(400, "CURSOR_INVALID", msg) from exc
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
    client: redis.Redis,
    layout: StateLayout,
    table: str,
    cursor: ScanCursor,
    limit: int,
) -> Page:
    """About ``limit`` entities from ``cursor`` on (SCAN's COUNT is a hint; a page may be short).

    Raises:
        ApiError: 410 when the cursor's generation has been removed.
    """
    registry = GenerationRegistry(client, layout)
    if registry.status(cursor.generation) is None:
        msg = (
            f"generation {cursor.generation} of {layout.processor}, which this scan began on, "
            "has been removed (replay gc). Start the scan again without a cursor."
        )
        raise ApiError(410, "CURSOR_EXPIRED", msg)
    keys = registry.keys(cursor.generation)
    pattern, prefix = keys.table_pattern(table), keys.table(table, "")
    position, names = cursor.position, []
    for _round in range(_MAX_ROUNDS):
        position, found = scan_round(client, position, pattern, max(limit, 10))
        names.extend(found)
        if position == 0 or len(names) >= limit:
            break
    items: list[tuple[str, Any]] = []
    if names:
        values = cast("list[bytes | None]", client.mget(names))
        items = [
            (name.decode()[len(prefix) :], orjson.loads(raw))
            for name, raw in zip(names, values, strict=True)
            if raw is not None
        ]
    following = (
        None
        if position == 0
        else ScanCursor(layout.processor, table, cursor.generation, int(position)).encode()
    )
    return Page(cursor.generation, items, following)
