"""Redis keys by pattern: SCAN in batches, and UNLINK what matches, never listing it all.

Every walk over a keyspace of refold (a table's entities, a window's buckets, a generation's or
a snapshot's keys, the registries) goes through here, so they share one batch size and one
decoding of names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import redis

__all__ = ["SCAN_COUNT", "scan_batches", "scan_names", "unlink_matching"]

SCAN_COUNT = 1000  # keys per SCAN round trip, and per MGET or UNLINK that follows it


def scan_names(client: redis.Redis, pattern: str) -> Iterator[str]:
    """Every key name matching ``pattern``, decoded, in no order (a key may come twice)."""
    for raw in client.scan_iter(match=pattern, count=SCAN_COUNT):
        yield raw.decode() if isinstance(raw, bytes) else str(raw)


def scan_batches(client: redis.Redis, pattern: str, size: int = SCAN_COUNT) -> Iterator[list[str]]:
    """The names matching ``pattern`` in lists of at most ``size``: one MGET or pipeline each."""
    batch: list[str] = []
    for name in scan_names(client, pattern):
        batch.append(name)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def unlink_matching(
    client: redis.Redis, pattern: str, *, only: Callable[[str], bool] | None = None
) -> int:
    """UNLINK every key matching ``pattern`` (and ``only``, when given); returns how many.

    Deletes batch by batch as SCAN finds them, so a generation of millions of keys is never
    held in memory. UNLINK frees the values in the background: Redis does not stall.
    """
    removed = 0
    for batch in scan_batches(client, pattern):
        chosen = batch if only is None else [n for n in batch if only(n)]
        if chosen:
            removed += int(client.unlink(*chosen))
    return removed
