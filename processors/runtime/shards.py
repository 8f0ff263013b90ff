"""Splitting a transaction's records by shard: one transaction per partition id (pure).

A generation sharded by partition id (``GenerationKeys.shards``, on a Redis Cluster) writes each
partition id's positions, guards and state under the shard's own hash tag, so every transaction
of the fold stays in one Redis Cluster slot. A task that hands the envelope records of several
partition ids (several topics, co-partitioned) gets one transaction per shard, in shard order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from refold.contracts.layout import parse_position_field
from refold.processors.fold.records import SourceRecord

__all__ = ["ShardPart", "split_by_shard"]

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
