"""Sharding by partition id: which generations are sharded, and one transaction per shard.

A generation sharded by partition id (``GenerationKeys.shards``, on a Redis Cluster) writes each
partition id's positions, guards and state under the shard's own hash tag, so every transaction
of the fold stays in one Redis Cluster slot. A task that hands the envelope records of several
partition ids (several topics, co-partitioned) gets one transaction per shard, in shard order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from refold.contracts.layout import parse_position_field
from refold.contracts.topics import TopicSpec
from refold.processors.fold.projection import Projection
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import Keying
from refold.processors.runtime.engines import engine_of

__all__ = ["SHARDABLE_KINDS", "SHARDED_KINDS", "ShardPart", "split_by_shard", "wanted_shards"]

# The kinds of state a generation sharded by partition id can hold: entities (each on one
# partition) and windows (each partition id keeps its share of every bucket, sketch and close
# timer; readers and the closer merge the shards). Lookups and kinds added as modules keep
# state several partitions share.
SHARDABLE_KINDS = frozenset({"entity", "windows"})
# The kinds a new generation is sharded for by ``auto`` (on a cluster), chosen by measurement
# (``python -m bench cluster [--windows]``, docs/state-layout.md "On a Redis Cluster"):
# entities. Windows sharded 8 ways wrote at 60-80% of one slot's rate (each shard writes its
# own copy of the hot buckets) and read 5-15x slower (every bucket and sketch from 8 shards),
# so ``auto`` keeps a window processor in one slot; ``on`` shards every kind of
# :data:`SHARDABLE_KINDS`, for a window processor whose state outgrows one master.
SHARDED_KINDS = frozenset({"entity"})

# One shard's part of a transaction: the shard, its records (each partition's in offset order)
# and the ranges it covers.
ShardPart = tuple[int, list[SourceRecord], dict[str, tuple[int, int]]]


def split_by_shard(
    records: Sequence[SourceRecord], covered: Mapping[str, tuple[int, int]]
) -> list[ShardPart]:
    """The records and covered ranges of each shard (partition id), in shard order."""
    parts: dict[int, list[SourceRecord]] = {}
    for record in records:
        parts.setdefault(record.partition, []).append(record)
    ranges: dict[int, dict[str, tuple[int, int]]] = {}
    for field_name, span in covered.items():
        _topic, partition = cast("tuple[str, int]", parse_position_field(field_name))
        ranges.setdefault(partition, {})[field_name] = span
    return [
        (shard, parts.get(shard, []), ranges.get(shard, {}))
        for shard in sorted(parts.keys() | ranges.keys())
    ]


def wanted_shards(
    projection: Projection,
    topics: Sequence[TopicSpec],
    keying: Keying | None,
    mode: str,
    cluster: bool,
) -> int:
    """How many shards a new generation of ``projection`` gets: its partition count, or 0.

    Sharded: a co-partitioned fold of one of :data:`SHARDED_KINDS` with ``mode`` ``auto`` on
    a Redis Cluster (entities: each transaction writes one partition id's), or of one of
    :data:`SHARDABLE_KINDS` with ``mode`` ``on`` (window processors too, which ``auto`` keeps
    in one slot: measured, one slot is faster; see :data:`SHARDED_KINDS`). Never lookups and
    kinds added as modules (they keep state several partitions share), re-keyed processors
    (their slots share links), DataFrame and archive processors (written by the driver or as
    files).
    """
    if mode == "off" or (mode == "auto" and not cluster) or not topics:
        return 0
    kinds = SHARDABLE_KINDS if mode == "on" else SHARDED_KINDS
    kind = engine_of(projection).state_kind(projection)  # None: DataFrame and archive
    if (keying is not None and keying.slots) or kind not in kinds:
        return 0
    counts = {t.partitions for t in topics}
    return counts.pop() if len(counts) == 1 else 0
