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
        client: A redis-py client (a cluster client too: every key is in the generation's
            slot), or a caller's WATCHing pipeline, whose reads run at once.
        keys: The generation's keys.
        slots: Its writer slots (re-keyed; 0: its entities are owned by partitions). Only
            :meth:`read` (the batch id every slot applied), :meth:`set` and :meth:`start` use it.
    """

    client: redis.Redis
    keys: GenerationKeys
    slots: int = 0

    @property
    def key(self) -> str:
        """The hash readers read: per partition the next offset to apply, and the batch id."""
        return self.keys.positions

    def writer_key(self, slot: int | None = None) -> str:
        """The hash a writer moves in its transaction: its writer slot's, or the generation's."""
        return self.key if slot is None else self.keys.slot_positions(slot)

    def slot_keys(self) -> list[str]:
        """Every writer slot's hash (none unless re-keyed)."""
        return [self.keys.slot_positions(s) for s in range(self.slots)]

    def watch_keys(self) -> tuple[str, ...]:
        """What a guarded writer, a snapshot or a flip WATCHes: any commit of a batch moves it."""
        return (self.key,)

    # -- reads ---------------------------------------------------------------------------

    def read(self, via: _Reader | None = None) -> Applied:
        """The positions and the last batch id, in one round trip.

        Re-keyed (``slots``): the batch id every writer slot has applied (``None`` until each
        has one), read in one transaction with the positions; ``via`` is refused there.
        """
        reader = self.client if via is None else via
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
        """The positions of ``fields`` (``topic/partition``) that have one: one HMGET."""
        reader = self.client if via is None else via
        return parse_fields(fields, cast("list[bytes | None]", reader.hmget(self.key, fields)))

    def queue(self, pipe: redis.client.Pipeline) -> None:
        """Queue the read in a caller's pipeline, with its other reads (one snapshot).

        Its reply, in the caller's place in the pipeline's replies, goes to :meth:`parse`.
        """
        pipe.hgetall(self.key)

    @staticmethod
    def parse(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Applied:
        """The reply of the read :meth:`queue` queued (:func:`parse_positions`)."""
        return parse_positions(raw)

    # -- writes outside the fold's transaction --------------------------------------------

    def set(self, positions: Mapping[str, int]) -> None:
        """Set where folding resumes (``topic/partition`` -> offset), every writer slot too.

        A re-keyed generation's positions are the minimum over its slots' positions, so a reset
        moves the slots' positions with them. One transaction.
        """
        mapping: dict[FieldT, EncodableT] = {f: str(o) for f, o in positions.items()}
        with self.client.pipeline(transaction=True) as pipe:
            for key in (self.key, *self.slot_keys()):
                pipe.hset(key, mapping=mapping)
            pipe.execute()

    def start(self, pipe: redis.client.Pipeline, field: str, offset: int) -> None:
        """Queue a partition's starting position, every writer slot's too, unless it has one."""
        for key in (self.key, *self.slot_keys()):
            pipe.hsetnx(key, field, str(offset))
