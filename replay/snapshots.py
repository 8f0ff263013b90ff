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
=============================================  ======  ==========================================

Snapshots belong to their generation: ``replay gc`` removes them with it.

Consistency: the sink commits each batch's state and positions in one MULTI/EXEC that also
writes the positions hash. A snapshot WATCHes that hash, lists the keys, and copies them all in
one MULTI/EXEC; a batch committed in between aborts the copy, which is retried.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import cast

import redis

from refold.contracts.layout import position_field
from refold.contracts.store.generations import GenerationRegistry, Positions
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
    """

    processor: str
    generation: int
    snapshot: int
    positions: Positions
    created_at: float
    keys: int
    code_fingerprint: str = ""

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
        return f"{self.registry.keys(generation).base}:snapshots"

    def _sequence(self, generation: int) -> str:
        return f"{self.registry.keys(generation).base}:snapshot_seq"

    def _snapshot_base(self, generation: int, snapshot: int) -> str:
        return f"{self.registry.keys(generation).base}:snap:{snapshot}"

    def take(self, generation: int, *, attempts: int = 50) -> Snapshot:
        """Copy ``generation``'s state and positions at one instant.

        Args:
            generation: A generation that has applied records.
            attempts: Copies to try while batches keep committing in between.

        Returns:
            The snapshot.

        Raises:
            SnapshotError: Unknown generation, nothing applied yet, or every attempt was
                overtaken by a batch commit.
        """
        if self.registry.status(generation) is None:
            msg = f"{self.registry.layout.processor} has no generation {generation}"
            raise SnapshotError(msg)
        keys = self.registry.keys(generation)
        applied = self.registry.positions_of(generation)
        index = self._index(generation)
        for attempt in range(1, attempts + 1):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*applied.watch_keys())  # type: ignore[no-untyped-call]
                    positions = applied.read(via=pipe).positions
                    if not positions:
                        msg = (
                            f"g{generation} has applied nothing yet: there is no state to "
                            "snapshot. Start its processor first."
                        )
                        raise SnapshotError(msg)
                    # Listed after WATCH: a commit that adds keys after this aborts the copy.
                    names = [
                        k for k in scan_names(self.client, keys.pattern()) if keys.is_state_key(k)
                    ]
                    snapshot = int(self.client.incr(self._sequence(generation)))
                    target = self._snapshot_base(generation, snapshot)
                    info = Snapshot(
                        self.registry.layout.processor,
                        generation,
                        snapshot,
                        positions,
                        time.time(),
                        len(names),
                        self.registry.meta(generation).get("code_fingerprint", ""),
                    )
                    pipe.multi()
                    for name in names:
                        pipe.copy(name, f"{target}:{name[len(keys.base) + 1 :]}", replace=True)
                    pipe.hset(index, str(snapshot), json.dumps(info.as_dict()))
                    pipe.execute()
                except redis.WatchError:
                    logger.debug("snapshot of g%d overtaken by a commit (%d)", generation, attempt)
                    continue
            logger.info(
                "snapshot %s: %d keys at %d applied records",
                info.name,
                info.keys,
                sum(positions.values()),
            )
            return info
        msg = (
            f"could not snapshot g{generation}: a batch committed during each of {attempts} "
            "attempts. Operator action: retry when traffic is lower, or stop the processor."
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
        processor yet, so this copy needs no atomicity.
        """
        source = self._snapshot_base(snapshot.generation, snapshot.snapshot)
        target = self.registry.keys(generation).base
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

    def delete(self, generation: int, snapshot: int) -> int:
        """Remove one snapshot; returns the keys removed."""
        removed = unlink_matching(self.client, f"{self._snapshot_base(generation, snapshot)}:*")
        self.client.hdel(self._index(generation), str(snapshot))
        return removed
