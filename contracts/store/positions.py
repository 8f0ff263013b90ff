"""A generation's applied positions: the one owner of where they live and how they read.

A generation's positions say, per source partition, the next offset to apply, with the id of
the last Spark batch applied. Today they are one hash (``GenerationKeys.positions``); a
re-keyed generation adds a hash per writer slot (``slot_positions``), and the generation's
hash holds the minimum over the slots, so everything reads a re-keyed generation as any other
(the batch id excepted: each slot keeps its own). Every reader, the WATCHes of the guarded
writers and the flip, and the resets name these keys through :class:`GenerationPositions`,
so that where positions live can change in one place (issue 21: positions per partition on a
Redis Cluster). The fold envelope's writers move them inside their own transaction, with the
key :meth:`GenerationPositions.writer_key` names.

A sharded generation (``GenerationKeys.shards``, on a Redis Cluster) keeps each partition id's
positions in its shard's hash, beside the state the partition's transactions write, so no
transaction crosses a slot; reads gather the shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import redis
from redis.typing import EncodableT, FieldT

from refold.contracts.layout import BATCH_ID_FIELD, GenerationKeys, parse_position_field

__all__ = ["Applied", "GenerationPositions", "Positions", "parse_fields", "parse_positions"]

Positions = dict[tuple[str, int], int]

# Where a read goes: the client, or a pipeline (WATCHing: it runs the command at once).
_Reader = redis.Redis | redis.client.Pipeline


class Applied(NamedTuple):
    """What a generation has applied: next offset per topic partition, and the last batch id."""

    positions: Positions
    batch_id: int | None


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_positions(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Applied:
    """A positions hash as HGETALL returns it; fields that name no partition are left out."""
    positions: Positions = {}
    batch_id = None
    for field_raw, value in raw.items():
        field = _decode(field_raw)
        if field == BATCH_ID_FIELD:
            batch_id = int(value)
            continue
        parsed = parse_position_field(field)
        if parsed is not None:
            positions[parsed] = int(value)
    return Applied(positions, batch_id)


def parse_fields(fields: Sequence[str], raw: Sequence[bytes | str | None]) -> dict[str, int]:
    """HMGET's reply for ``fields``, as ``field -> offset``; fields with no position left out."""
    return {f: int(v) for f, v in zip(fields, raw, strict=True) if v is not None}


@dataclass(frozen=True, slots=True)
class GenerationPositions:
    """The applied positions of one generation.

    Args:
        client: A redis-py client (a cluster client too), or a caller's WATCHing pipeline,
            whose reads run at once.
        keys: The generation's keys. Sharded (``keys.shards``: a Redis Cluster), each Kafka
            partition id's positions live in its shard's hash, next to the state its
            transactions write (``GenerationKeys.for_shard``), and a read gathers the shards.
        slots: Its writer slots (re-keyed; 0: its entities are owned by partitions). Only
            :meth:`read` (the batch id every slot applied), :meth:`set` and :meth:`start` use it.
            A re-keyed generation is never sharded (its slots share its links).
    """

    client: redis.Redis
    keys: GenerationKeys
    slots: int = 0

    def __post_init__(self) -> None:
        if self.slots and self.keys.shards:
            msg = "a re-keyed generation is not sharded: its writer slots share its links"
            raise ValueError(msg)

    @property
    def key(self) -> str:
        """The hash readers read: per partition the next offset to apply, and the batch id.

        Of these keys' shard when they name one (a sharded generation's writer).
        """
        return self.keys.positions

    def shard_of(self, field: str) -> int:
        """The shard of a ``topic/partition`` field: its partition id (sharded generations)."""
        parsed = parse_position_field(field)
        if parsed is None:
            msg = f"{field!r} names no topic partition"
            raise ValueError(msg)
        return parsed[1]

    def hashes(self) -> list[str]:
        """Every hash holding positions: the generation's, or each shard's."""
        return self.keys.positions_hashes()

    def writer_key(self, slot: int | None = None) -> str:
        """The hash a writer moves in its transaction: its writer slot's, or the generation's.

        Sharded, the writer's keys name its shard (``keys.for_shard``): that shard's hash.
        """
        return self.key if slot is None else self.keys.slot_positions(slot)

    def slot_keys(self) -> list[str]:
        """Every writer slot's hash (none unless re-keyed)."""
        return [self.keys.slot_positions(s) for s in range(self.slots)]

    def watch_keys(self) -> tuple[str, ...]:
        """What a guarded writer, a snapshot or a flip WATCHes: any commit of a batch moves it.

        Sharded: every shard's hash (one WATCH covers them on a single Redis only; on a
        cluster the flip reads them instead, see ``GenerationRegistry.flip_if_caught_up``).
        """
        return tuple(self.hashes())

    def _sharded(self) -> bool:
        return bool(self.keys.shards) and self.keys.shard is None

    # -- reads ---------------------------------------------------------------------------

    def read(self, via: _Reader | None = None) -> Applied:
        """The positions and the last batch id, in one round trip.

        Re-keyed (``slots``): the batch id every writer slot has applied (``None`` until each
        has one), read in one transaction with the positions; ``via`` is refused there.
        Sharded: every shard's hash, in one pipeline (through ``via``: one read each), a
        snapshot of each shard, not of all (a partition's position is what its shard applied);
        the batch id is the latest any shard applied, as one hash that every batch writes
        holds it.
        """
        reader = self.client if via is None else via
        if self._sharded():
            if via is not None:  # a WATCHing pipeline runs each read at once
                replies = [via.hgetall(key) for key in self.hashes()]
                return self.parse_replies(cast("list[dict[bytes, bytes]]", replies))
            with self.client.pipeline(transaction=False) as pipe:
                self.queue(pipe)
                return self.parse_replies(pipe.execute())
        if not self.slots:
            return self.parse(cast("dict[bytes, bytes]", reader.hgetall(self.key)))
        if via is not None:
            # Its slots are read in a transaction of its own; a caller's WATCH would not cover it.
            msg = "a re-keyed generation's positions are read in their own transaction, not via"
            raise ValueError(msg)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.key)
            for key in self.slot_keys():
                pipe.hgetall(key)
            raw, *per_slot = cast("list[dict[bytes, bytes]]", pipe.execute())
        batches = [parse_positions(r).batch_id for r in per_slot]
        batch = None if None in batches else min(cast("list[int]", batches))
        return Applied(parse_positions(raw).positions, batch)

    def read_fields(self, fields: Sequence[str], via: _Reader | None = None) -> dict[str, int]:
        """The positions of ``fields`` (``topic/partition``) that have one: one HMGET.

        Sharded: one HMGET per shard the fields are in; through ``via`` (a writer's WATCHing
        pipeline), they must all be in one shard.
        """
        reader = self.client if via is None else via
        if not self._sharded():
            return parse_fields(fields, cast("list[bytes | None]", reader.hmget(self.key, fields)))
        by_shard: dict[int, list[str]] = {}
        for field in fields:
            by_shard.setdefault(self.shard_of(field), []).append(field)
        if via is not None and len(by_shard) > 1:
            msg = f"fields of {len(by_shard)} shards read through one pipeline"
            raise ValueError(msg)
        found: dict[str, int] = {}
        for shard, names in by_shard.items():
            key = self.keys.for_shard(shard).positions
            found.update(parse_fields(names, cast("list[bytes | None]", reader.hmget(key, names))))
        return found

    def queue(self, pipe: redis.client.Pipeline) -> int:
        """Queue the read in a caller's pipeline, with its other reads; the replies it queued.

        Those replies, in the caller's place in the pipeline's replies, go to
        :meth:`parse_replies` (one reply, unsharded: :meth:`parse` too).
        """
        hashes = self.hashes()
        for key in hashes:
            pipe.hgetall(key)
        return len(hashes)

    @staticmethod
    def parse(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Applied:
        """The reply of an unsharded read :meth:`queue` queued (:func:`parse_positions`)."""
        return parse_positions(raw)

    @staticmethod
    def parse_replies(replies: Sequence[Mapping[bytes, bytes] | Mapping[str, str]]) -> Applied:
        """The replies of the read :meth:`queue` queued: the shards' positions, gathered."""
        positions: Positions = {}
        batches = []
        for raw in replies:
            applied = parse_positions(raw)
            positions.update(applied.positions)
            if applied.batch_id is not None:
                batches.append(applied.batch_id)
        return Applied(positions, max(batches) if batches else None)

    # -- writes outside the fold's transaction --------------------------------------------

    def set(self, positions: Mapping[str, int]) -> None:
        """Set where folding resumes (``topic/partition`` -> offset), every writer slot too.

        A re-keyed generation's positions are the minimum over its slots' positions, so a reset
        moves the slots' positions with them. One transaction (sharded: one per shard).
        """
        if self._sharded():
            by_shard: dict[int, dict[str, int]] = {}
            for field, offset in positions.items():
                by_shard.setdefault(self.shard_of(field), {})[field] = offset
            for shard, part in sorted(by_shard.items()):
                GenerationPositions(self.client, self.keys.for_shard(shard)).set(part)
            return
        mapping: dict[FieldT, EncodableT] = {f: str(o) for f, o in positions.items()}
        with self.client.pipeline(transaction=True) as pipe:
            for key in (self.key, *self.slot_keys()):
                pipe.hset(key, mapping=mapping)
            pipe.execute()

    def start(self, pipe: redis.client.Pipeline, field: str, offset: int) -> None:
        """Queue a partition's starting position, every writer slot's too, unless it has one.

        Sharded: in the partition's shard (``pipe`` must not be a transaction on a cluster).
        """
        if self._sharded():
            pipe.hsetnx(self.keys.for_shard(self.shard_of(field)).positions, field, str(offset))
            return
        for key in (self.key, *self.slot_keys()):
            pipe.hsetnx(key, field, str(offset))
