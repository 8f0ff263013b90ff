"""State snapshots: a consistent copy of one generation's state and applied positions.

A rebuild that starts anywhere but the earliest offset needs the state as of its start: the
records before it are not folded again. :meth:`SnapshotStore.take` copies a generation's state
and positions at one instant (while its processor keeps running); :meth:`SnapshotStore.seed`
copies a snapshot into a new generation, which then folds the log from the snapshot's positions.

Layout (inside the generation's hash tag, so the snapshot's MULTI/EXEC of COPY commands also
runs on a cluster; see :mod:`refold.contracts.layout`):

=============================================  ======  ==========================================
``<p>:{<proc>.g<N>}:snapshots``                 hash    snapshot id -> JSON (positions, time, ...)
``<p>:{<proc>.g<N>}:snapshot_seq``              string  last snapshot id
``<p>:{<proc>.g<N>}:snap:<S>:<state key>``      any     copy of ``<p>:{<proc>.g<N>}:<state key>``
``<p>:{<shard tag>}:snap:<S>:<state key>``      any     sharded: copy of ``<p>:{<shard tag>}:<state
                                                        key>``, in the shard's own slot
=============================================  ======  ==========================================

Snapshots belong to their generation: ``replay gc`` removes them with it.

Consistency: the sink commits each batch's state and positions in one MULTI/EXEC that also
writes the positions hash. A snapshot WATCHes that hash, lists the keys, and copies them all in
one MULTI/EXEC; a batch committed in between aborts the copy, which is retried.

A generation sharded by partition id (``GenerationKeys.shards``) commits each partition id's
state and positions in its shard's own transaction, in the shard's own slot, and no Redis
Cluster transaction spans two slots. Its snapshot is that copy done shard by shard (each its own
WATCH, listing and MULTI/EXEC), then recorded in the generation's home: each shard's copy is its
state exactly at its positions, taken at its own instant. That is the state of the snapshot's
positions all the same, since a shard holds everything its partitions' records changed and
nothing another partition's did (a sharded fold is co-partitioned; aggregates are kept per
shard); what the positions of two partitions never were, one point in time, it is not either.
A sharded snapshot seeds a generation with the same shards, shard to shard (a replay's
generation, whose processor's first run has not decided its shards yet, takes the snapshot's);
seeding across shard counts is refused.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import cast

import redis

from refold.contracts.layout import GenerationKeys, position_field
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry, Positions
from refold.contracts.store.positions import GenerationPositions
from refold.contracts.store.scan import scan_names, unlink_matching
from refold.replay.errors import PlanError

__all__ = ["Snapshot", "SnapshotError", "SnapshotStore"]

logger = logging.getLogger(__name__)

_COPY_CHUNK = 1_000  # DUMP/RESTORE pairs per pipeline round trip when seeding


class SnapshotError(PlanError):
    """A snapshot cannot be taken or used; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot of one generation.

    Attributes:
        processor: Processor name.
        generation: The generation it was taken from.
        snapshot: Its id within that generation.
        positions: Next offset to apply per partition at the instant of the copy.
        created_at: Unix time of the copy.
        keys: Keys copied (state, aggregates, positions, guards).
        code_fingerprint: Code fingerprint of the generation when it was taken.
        shards: The generation's shards (``GenerationKeys.shards``; 0: unsharded): it seeds
            only a generation with as many.
    """

    processor: str
    generation: int
    snapshot: int
    positions: Positions
    created_at: float
    keys: int
    code_fingerprint: str = ""
    shards: int = 0

    @property
    def name(self) -> str:
        """``g<N>/s<S>``, as shown by the CLI."""
        return f"g{self.generation}/s{self.snapshot}"

    def as_dict(self) -> dict[str, object]:
        """For ``--json`` output."""
        return {
            "processor": self.processor,
            "snapshot": self.name,
            "generation": self.generation,
            "id": self.snapshot,
            "created_at": self.created_at,
            "keys": self.keys,
            "code_fingerprint": self.code_fingerprint,
            "shards": self.shards,
            "positions": {position_field(t, p): o for (t, p), o in sorted(self.positions.items())},
        }


class SnapshotStore:
    """Takes, lists, seeds from and deletes snapshots of one processor's generations.

    Args:
        registry: The processor's generation registry (its Redis client is used).
    """

    def __init__(self, registry: GenerationRegistry) -> None:
        self.registry = registry
        self.client = registry.client

    def _index(self, generation: int) -> str:
        return f"{self.registry.keys(generation).home}:snapshots"

    def _sequence(self, generation: int) -> str:
        return f"{self.registry.keys(generation).home}:snapshot_seq"

    @staticmethod
    def _copies(keys: GenerationKeys, snapshot: int) -> str:
        """Where snapshot ``snapshot`` of the state under ``keys`` (a shard's) is copied."""
        return f"{keys.base}:snap:{snapshot}"

    def _shards(self, generation: int, shards: int) -> list[GenerationKeys]:
        """The keys of each shard of ``generation`` (one, its own, when unsharded)."""
        return self.registry.layout.generation(generation, shards).each_shard()

    def take(self, generation: int, *, attempts: int = 50) -> Snapshot:
        """Copy ``generation``'s state and positions at one instant (sharded: per shard).

        Args:
            generation: A generation that has applied records.
            attempts: Copies to try, per shard, while batches keep committing in between.

        Returns:
            The snapshot, recorded once every shard is copied.

        Raises:
            SnapshotError: Unknown generation, nothing applied yet, or every attempt was
                overtaken by a batch commit (the copies made are removed).
        """
        if self.registry.status(generation) is None:
            msg = f"{self.registry.layout.processor} has no generation {generation}"
            raise SnapshotError(msg)
        keys = self.registry.keys(generation)
        if not self.registry.positions_of(generation).read().positions:
            msg = (
                f"g{generation} has applied nothing yet: there is no state to snapshot. "
                "Start its processor first."
            )
            raise SnapshotError(msg)
        snapshot = int(self.client.incr(self._sequence(generation)))
        positions: Positions = {}
        copied = 0
        try:
            for shard in keys.each_shard():
                part, names = self._copy(shard, snapshot, attempts)
                positions.update(part)
                copied += names
        except SnapshotError:
            self._remove_copies(generation, keys.shards, snapshot)
            raise
        info = Snapshot(
            self.registry.layout.processor,
            generation,
            snapshot,
            positions,
            time.time(),
            copied,
            self.registry.meta(generation).get("code_fingerprint", ""),
            keys.shards,
        )
        # Recorded last: a snapshot is used only once every shard's copy is there.
        self.client.hset(self._index(generation), str(snapshot), json.dumps(info.as_dict()))
        logger.info(
            "snapshot %s: %d keys at %d applied records",
            info.name,
            info.keys,
            sum(positions.values()),
        )
        return info

    def _copy(self, keys: GenerationKeys, snapshot: int, attempts: int) -> tuple[Positions, int]:
        """Copy the state under ``keys`` (one slot) with its positions in one MULTI/EXEC.

        Returns:
            The positions copied, and how many keys.
        """
        applied = GenerationPositions(self.client, keys)  # a shard's keys: its own hash
        target = self._copies(keys, snapshot)
        for attempt in range(1, attempts + 1):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*applied.watch_keys())  # type: ignore[no-untyped-call]
                    positions = applied.read(via=pipe).positions
                    # Listed after WATCH: a commit that adds keys after this aborts the copy.
                    names = [
                        k for k in scan_names(self.client, keys.pattern()) if keys.is_state_key(k)
                    ]
                    pipe.multi()
                    for name in names:
                        pipe.copy(name, f"{target}:{name[len(keys.base) + 1 :]}", replace=True)
                    pipe.execute()
                except redis.WatchError:
                    logger.debug("snapshot of %s overtaken by a commit (%d)", keys.base, attempt)
                    continue
            return positions, len(names)
        msg = (
            f"could not snapshot g{keys.generation}"
            f"{'' if keys.shard is None else f' (shard {keys.shard})'}: a batch committed "
            f"during each of {attempts} attempts. Operator action: retry when traffic is "
            "lower, or stop the processor."
        )
        raise SnapshotError(msg)

    def list(self, generation: int | None = None) -> list[Snapshot]:
        """Snapshots of one generation, or of every generation, oldest first."""
        generations = (
            [generation]
            if generation is not None
            else [info.generation for info in self.registry.list()]
        )
        result = []
        for gen in generations:
            raw = cast("dict[bytes, bytes]", self.client.hgetall(self._index(gen)))
            for sid, body in raw.items():
                data = json.loads(body)
                positions = {}
                for field, offset in data["positions"].items():
                    topic, _sep, partition = field.rpartition("/")
                    positions[(topic, int(partition))] = int(offset)
                result.append(
                    Snapshot(
                        self.registry.layout.processor,
                        gen,
                        int(sid),
                        positions,
                        float(data["created_at"]),
                        int(data["keys"]),
                        str(data.get("code_fingerprint", "")),
                        int(data.get("shards", 0)),
                    )
                )
        return sorted(result, key=lambda s: (s.created_at, s.generation, s.snapshot))

    def get(self, generation: int, snapshot: int) -> Snapshot:
        """One snapshot, looked up before anything is changed.

        Raises:
            SnapshotError: It is gone (``replay gc`` removed its generation, or it was deleted).
        """
        found = next((s for s in self.list(generation) if s.snapshot == snapshot), None)
        if found is None:
            msg = (
                f"snapshot g{generation}/s{snapshot} disappeared (replay gc?); nothing was changed"
            )
            raise SnapshotError(msg)
        return found

    def best_for(self, targets: Positions, log_starts: Positions | None = None) -> Snapshot | None:
        """The newest snapshot a rebuild from ``targets`` can start from.

        A snapshot qualifies when, on every partition, its position is at or before the target
        (so no record after the target is in its state twice) and at or after the log start
        (the records between the snapshot and the target are still in the log).
        """
        starts = log_starts or {}
        usable = [
            s
            for s in self.list()
            if all(starts.get(tp, 0) <= s.positions.get(tp, 0) <= t for tp, t in targets.items())
            and set(s.positions) <= set(targets)
        ]
        return max(usable, key=lambda s: (sum(s.positions.values()), s.created_at), default=None)

    def seed(self, snapshot: Snapshot, generation: int) -> int:
        """Copy ``snapshot`` into the (empty) ``generation``; returns the keys copied.

        DUMP/RESTORE rather than COPY: the two generations have different hash tags, so they
        may live on different cluster nodes. The new generation is not live and has no
        processor yet, so this copy needs no atomicity. A sharded snapshot is copied shard to
        shard, into a generation with the same shards; a generation whose shards are not
        decided yet (a replay's, before its processor's first run) takes the snapshot's.

        Raises:
            SnapshotError: ``generation`` has other shards than the snapshot's, or keys of the
                snapshot are gone (the seed would be partial).
        """
        if self.registry.meta(generation).get(SHARDS_FIELD) == "":  # undecided
            self.registry.decide_shards(generation, snapshot.shards)
        self.check_seedable(snapshot, generation)
        targets = self.registry.keys(generation).each_shard()
        sources = self._shards(snapshot.generation, snapshot.shards)
        copied = sum(
            self._restore(self._copies(source, snapshot.snapshot), target.base)
            for source, target in zip(sources, targets, strict=True)
        )
        if copied != snapshot.keys:
            # Keys vanished under us (a concurrent `replay gc`, an eviction policy): the seed
            # would be a partial state that still claims the snapshot's positions.
            msg = (
                f"snapshot {snapshot.name} has {copied} of its {snapshot.keys} keys left; "
                f"g{generation} is incomplete and must not be used. Operator action: take a "
                "new snapshot (`replay snapshot`) or rebuild --to-earliest; check that Redis "
                "does not evict keys (maxmemory-policy noeviction)."
            )
            raise SnapshotError(msg)
        self.registry.update_meta(generation, {"seeded_from": snapshot.name})
        return copied

    def check_seedable(self, snapshot: Snapshot, generation: int) -> None:
        """Refuse, before anything changes, a seed of ``generation`` across shard counts.

        A generation whose shards are undecided yet takes the snapshot's (:meth:`seed`).

        Raises:
            SnapshotError: ``generation`` has other shards than the snapshot's.
        """
        if self.registry.meta(generation).get(SHARDS_FIELD) == "":
            return
        shards = self.registry.keys(generation).shards
        if snapshot.shards != shards:
            msg = (
                f"snapshot {snapshot.name} holds a generation sharded {snapshot.shards} ways "
                f"(0: unsharded) and g{generation} is sharded {shards} ways: a shard's state "
                "seeds only the same shard. Nothing was copied. Operator action: rebuild "
                "--to-earliest (no snapshot), or seed from a snapshot of a generation with "
                f"{shards} shards."
            )
            raise SnapshotError(msg)

    def _restore(self, source: str, target: str) -> int:
        """DUMP every key under ``source`` and RESTORE it under ``target``; how many."""
        names = list(scan_names(self.client, f"{source}:*"))
        copied = 0
        for start in range(0, len(names), _COPY_CHUNK):
            chunk = names[start : start + _COPY_CHUNK]
            with self.client.pipeline(transaction=False) as pipe:
                for name in chunk:
                    pipe.dump(name)
                dumps = pipe.execute()
            with self.client.pipeline(transaction=False) as pipe:
                for name, payload in zip(chunk, dumps, strict=True):
                    if payload is not None:
                        pipe.restore(
                            f"{target}:{name[len(source) + 1 :]}", 0, payload, replace=True
                        )
                        copied += 1
                pipe.execute()
        return copied

    def delete(self, generation: int, snapshot: int) -> int:
        """Remove one snapshot (every shard's copies); returns the keys removed."""
        removed = self._remove_copies(generation, self.registry.keys(generation).shards, snapshot)
        self.client.hdel(self._index(generation), str(snapshot))
        return removed

    def _remove_copies(self, generation: int, shards: int, snapshot: int) -> int:
        return sum(
            unlink_matching(self.client, f"{self._copies(keys, snapshot)}:*")
            for keys in self._shards(generation, shards)
        )
