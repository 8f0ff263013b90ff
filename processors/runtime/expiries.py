"""The state TTL's expiries in Redis: loaded under the writer's guard, written in its MULTI.

Pure rule in :mod:`refold.processors.fold.expiry`. The expiries of a timer group (partition id,
or re-keyed the writer slot) are one sorted set, entity -> expiry (event time, ms):
:meth:`~refold.contracts.layout.GenerationKeys.entity_expiries` and
:meth:`~refold.contracts.layout.GenerationKeys.slot_expiries` (the ``tm:`` namespace, so
snapshots, resets, diff and gc cover them). Runs on executors, in the fold's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from redis.client import Pipeline

from refold.contracts.layout import GenerationKeys
from refold.contracts.processors import StateTtl
from refold.processors.fold.expiry import Expiries

__all__ = ["expiries_key", "load_expiries", "write_expiries"]


def expiries_key(keys: GenerationKeys, group: int, slot: int | None) -> str:
    """The sorted set of a timer group's expiries: a partition id's, or the writer slot's."""
    return keys.entity_expiries(group) if slot is None else keys.slot_expiries(slot)


def load_expiries(
    pipe: Pipeline,
    keys: GenerationKeys,
    slot: int | None,
    ttl: StateTtl,
    marks: Mapping[int, int],
    touched: Mapping[int, Sequence[str]],
) -> Expiries:
    """The stored expiries a transaction needs (pre-MULTI, on the WATCHed pipeline).

    Args:
        pipe: The WATCHed pipeline (immediate mode).
        keys: The generation's keys.
        slot: The writer slot (None: co-partitioned).
        ttl: The processor's state TTL.
        marks: Per group, the last watermark of the transaction: the expiries up to it may fire.
        touched: Per group, the entities its records fold: their expiries decide
            :meth:`~refold.processors.fold.expiry.Expiries.stale`.
    """
    expiries = Expiries(ttl)
    for group in sorted(set(marks) | set(touched)):
        key = expiries_key(keys, group, slot)
        found: dict[str, int] = {}
        if group in marks:
            raw = cast(
                "list[tuple[bytes, float]]",
                pipe.zrangebyscore(key, "-inf", marks[group], withscores=True),
            )
            found.update((e.decode(), int(d)) for e, d in raw)
        names = sorted(set(touched.get(group, ())) - set(found))
        if names:
            scores = pipe.zmscore(key, names)
            found.update(
                (e, int(float(d))) for e, d in zip(names, scores, strict=True) if d is not None
            )
        expiries.load(group, sorted(found.items()))
    return expiries


def write_expiries(
    pipe: Pipeline, keys: GenerationKeys, expiries: Expiries, slot: int | None
) -> None:
    """Queue (inside MULTI) the expiries that changed: ZADD the new ones, ZREM the gone."""
    due: dict[int, dict[str, int]] = {}
    gone: dict[int, list[str]] = {}
    for (group, entity), at in expiries.queue.changed.items():
        if at is None:
            gone.setdefault(group, []).append(entity)
        else:
            due.setdefault(group, {})[entity] = at
    for group, members in sorted(gone.items()):
        pipe.zrem(expiries_key(keys, group, slot), *members)
    for group, mapping in sorted(due.items()):
        pipe.zadd(expiries_key(keys, group, slot), mapping)
