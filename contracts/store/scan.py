"""Redis keys by pattern: SCAN in batches, and UNLINK what matches, never listing it all.

Every walk over a keyspace of refold (a table's entities, a window's buckets, a generation's or
a snapshot's keys, the registries) goes through here, so they share one batch size and one
decoding of names. On a Redis Cluster a pattern with a hash tag (``...{order_state.g3}:t:*``)
is scanned on the one node that owns the tag's slot, and any other pattern on every master.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

import redis

from refold.contracts.store.connect import is_cluster

__all__ = ["SCAN_COUNT", "scan_batches", "scan_names", "scan_page", "unlink_matching"]

SCAN_COUNT = 1000  # keys per SCAN round trip, and per MGET or UNLINK that follows it
# Tries of a SCAN on a cluster node that refuses the connection (its slot failed over), with
# the cluster's slot map read again between them: ~9 s in all, as the nodes that answer may
# still name the dead master for a few seconds after its replica took over.
_ATTEMPTS = 8


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

    On a cluster the pattern must carry a hash tag: a cursor belongs to one node. When that
    node is gone (its slot failed over to a replica), the page is asked of the slot's new
    master; a cursor from the old one may then skip or repeat keys that the walk had not
    reached (SCAN's guarantees hold on one node), which a walk begun after the failover does
    not.
    """
    if not is_cluster(client):
        return cast("tuple[int, list[bytes]]", client.scan(cursor, match=pattern, count=count))
    for attempt in range(_ATTEMPTS):
        node = _tag_node(client, pattern)
        if node is None:
            msg = f"a SCAN cursor over a Redis Cluster needs a hash-tagged pattern, not {pattern!r}"
            raise ValueError(msg)
        try:
            # The cluster client answers {node name: cursor} and the names.
            cursors, found = cast(
                "tuple[dict[str, int], list[bytes]]",
                client.scan(cursor, match=pattern, count=count, target_nodes=node),
            )
        except (redis.ConnectionError, redis.TimeoutError):
            # A command sent to a named node is not re-routed by redis-py: when the slot's
            # master is gone (failed over, and this client's slot map is older), learn the
            # cluster's map again and ask the slot's master now.
            if attempt == _ATTEMPTS - 1:
                raise
            time.sleep(0.25 * (attempt + 1))
            client.nodes_manager.initialize()  # type: ignore[attr-defined]
            continue
        return int(next(iter(cursors.values()))), found
    raise AssertionError  # unreachable: the last attempt returns or raises


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
