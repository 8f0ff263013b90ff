"""Redis keys by pattern: SCAN in batches, and UNLINK what matches, never listing it all.

Every walk over a keyspace of refold (a table's entities, a window's buckets, a generation's or
a snapshot's keys, the registries) goes through here, so they share one batch size and one
decoding of names. On a Redis Cluster a pattern with a hash tag (``...{order_state.g3}:t:*``)
is scanned on the one node that owns the tag's slot, and any other pattern on every master.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import cast

import redis

from refold.contracts.store.connect import is_cluster

__all__ = ["SCAN_COUNT", "scan_batches", "scan_names", "scan_page", "unlink_matching"]

SCAN_COUNT = 1000  # keys per SCAN round trip, and per MGET or UNLINK that follows it


def _tag_node(client: redis.Redis, pattern: str) -> object | None:
    """The cluster node owning ``pattern``'s hash tag; None on a single server or untagged."""
    if not is_cluster(client):
        return None
    start = pattern.find("{")
    end = pattern.find("}", start + 1)
    tag = pattern[start + 1 : end] if 0 <= start < end else ""
    if not tag or any(c in tag for c in "*?[]\\"):
        return None
    return cast("object", client.get_node_from_key(pattern))  # type: ignore[attr-defined]


def scan_page(
    client: redis.Redis, cursor: int, pattern: str, count: int = SCAN_COUNT
) -> tuple[int, list[bytes]]:
    """One SCAN round trip: the next cursor (0: done) and the names it found.

    On a cluster the pattern must carry a hash tag: a cursor belongs to one node.
    """
    if not is_cluster(client):
        return cast("tuple[int, list[bytes]]", client.scan(cursor, match=pattern, count=count))
    node = _tag_node(client, pattern)
    if node is None:
        msg = f"a SCAN cursor over a Redis Cluster needs a hash-tagged pattern, not {pattern!r}"
        raise ValueError(msg)
    # The cluster client answers {node name: cursor} and the names.
    cursors, found = cast(
        "tuple[dict[str, int], list[bytes]]",
        client.scan(cursor, match=pattern, count=count, target_nodes=node),
    )
    return int(next(iter(cursors.values()))), found


def scan_names(client: redis.Redis, pattern: str) -> Iterator[str]:
    """Every key name matching ``pattern``, decoded, in no order (a key may come twice)."""
    if _tag_node(client, pattern) is None:
        found: Iterable[bytes | str] = client.scan_iter(match=pattern, count=SCAN_COUNT)
    else:
        found = _walk(client, pattern)
    for raw in found:
        yield raw.decode() if isinstance(raw, bytes) else str(raw)


def _walk(client: redis.Redis, pattern: str) -> Iterator[bytes]:
    cursor = None
    while cursor != 0:
        cursor, names = scan_page(client, cursor or 0, pattern)
        yield from names


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
