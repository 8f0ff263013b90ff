"""Generations of a processor's state in Redis: create, list, read positions, flip the alias.

Shared by processors (which create and write generations), replay (which builds a new one and
flips readers to it) and the reader (which resolves the live one). Only standard Redis commands.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT, FieldT

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.offsets_json import parse_offsets_json
from refold.contracts.layout import (
    DEFAULT_KEY_PREFIX,
    GenerationKeys,
    GenerationStatus,
    StateLayout,
    processor_of_registry_key,
    registries_pattern,
)
from refold.contracts.store.connect import is_cluster
from refold.contracts.store.lease import (
    claim_lease,
    lease_holder,
    lease_holder_alive,
    release_lease,
)
from refold.contracts.store.positions import Applied, GenerationPositions, Positions
from refold.contracts.store.scan import scan_names

__all__ = [
    "AS_OF_FIELD",
    "CHECKPOINT_EPOCH_FIELD",
    "CODE_REFUSED_FIELD",
    "ENDING_OFFSETS_FIELD",
    "RESET_PENDING_FIELD",
    "SHARDS_FIELD",
    "SLOTS_FIELD",
    "GenerationInfo",
    "GenerationRegistry",
    "Positions",
    "applied_records",
    "describe_runner",
    "is_abandoned",
    "processors_in_redis",
    "starting_positions",
    "status_and_live",
]

logger = logging.getLogger(__name__)

# A generation bounded at a moment (``replay --until``): its meta records the moment (an ISO
# time, or ``offsets``) and the offsets it stopped before (Spark's JSON); ``bounded_at`` is when
# it reached them (Unix ms) and its status became ``as_of``.
AS_OF_FIELD = "as_of"
ENDING_OFFSETS_FIELD = "ending_offsets"
# What a flip records of the generation it makes live, in the registry's ``flips`` hash.
_FLIP_FIELDS = ("live_since", "replaced")

# Meta field counting in-place resets of a generation. Each reset starts a new Spark checkpoint
# directory, so no processor, wherever its state directory is, resumes from a stale checkpoint.
CHECKPOINT_EPOCH_FIELD = "checkpoint_epoch"
# Meta field set while an in-place reset rewrites a generation (its reset spec); a processor
# refuses to start the generation until the reset that set it has finished.
RESET_PENDING_FIELD = "reset_in_place_pending"
# Meta field: the writer slots of a re-keyed generation, fixed when it is created.
SLOTS_FIELD = "slots"
# Meta field: the shards of a generation sharded by partition id (its topics' partition count),
# fixed when it is created; absent: one hash tag (``GenerationKeys.shards``).
SHARDS_FIELD = "shards"
# KEYS[1] a generation's meta; sets ARGV[1] to ARGV[2] unless it holds a count already ("":
# undecided); returns the count it holds.
_DECIDE_SHARDS = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and v ~= '' then return v end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""
# Meta field of a generation that a running processor refused to fold because it runs other
# code than the generation was built by (after a cutover): JSON {"code_fingerprint", "host",
# "pid", "at" (epoch ms), "from_generation"}. Cleared when a process with its code takes it.
CODE_REFUSED_FIELD = "code_refused"


def _alive(owner: str | None) -> str | None:
    """``owner`` unless it is a process of this host that is gone."""
    return owner if owner and lease_holder_alive(owner) else None


def _host_pid(owner: str) -> str:
    host, _sep, rest = owner.partition(":")
    return f"{host}:{rest.partition(':')[0]}"


def is_abandoned(status: str, lease_owner: str | None, builder: str | None) -> bool:
    """A ``building`` generation that nothing builds: no processor and no ``replay`` holds it.

    Left by a replay that was killed (``kill -9``, a lost host) or by a processor started with
    ``--generation new`` that stopped. ``replay gc`` removes it.
    """
    return status == "building" and _alive(lease_owner) is None and _alive(builder) is None


def describe_runner(
    status: str, lease_owner: str | None, meta: Mapping[str, str], builder: str | None = None
) -> str:
    """Who folds a generation, in a few words (``replay status``, the monitor, the dashboard).

    Args:
        status: ``building``, ``live``, ``retired`` or ``as_of``.
        lease_owner: The holder of its processing lease (``host:pid:nonce``), if any.
        meta: Its meta hash.
        builder: The holder of its builder lease (the ``replay`` building it), if any.

    Returns:
        ``running on host:pid``; ``starting (replay on host:pid)`` for a generation a replay
        builds whose processor has not started yet; ``abandoned (...)``; ``waiting for code
        <fingerprint> (<fingerprint> refused it)`` when a processor with other code stopped
        rather than fold it; ``not running`` for a live generation nobody folds; ``-`` for a
        retired one; ``as of <moment> ...`` for one bounded at a moment.
    """
    running = _alive(lease_owner)
    if running:
        return f"running on {_host_pid(running)}"
    if status == "as_of":
        return f"as of {meta.get(AS_OF_FIELD, '?')} (kept; readers name it)"
    if status == "building":
        building = _alive(builder)
        if building:
            return f"starting (replay on {_host_pid(building)})"
        return "abandoned (nothing builds it: `replay gc --execute` removes it)"
    refused = meta.get(CODE_REFUSED_FIELD)
    if refused and status != "retired":
        try:
            by = str(json.loads(refused).get("code_fingerprint", "?"))
        except (ValueError, AttributeError):
            by = "?"
        return f"waiting for code {meta.get('code_fingerprint', '?')} ({by} refused it)"
    return "-" if status == "retired" else "not running"


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """One generation as the registry knows it."""

    generation: int
    status: GenerationStatus
    meta: dict[str, str]


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def status_and_live(
    client: redis.Redis, layout: StateLayout, generation: int
) -> tuple[GenerationStatus | None, int | None]:
    """``generation``'s status and the live generation (the alias), read at one instant.

    One transaction: both keys are in the registry's slot, which a flip changes in one
    transaction too. Read one after the other, a flip between the two reads pairs
    ``building`` with an alias already naming ``generation``, a state that never exists, and
    a rebuild takes itself for one with no live generation to compare with.
    """
    with client.pipeline(transaction=True) as pipe:
        pipe.hget(layout.generations, str(generation))
        pipe.get(layout.alias)
        raw_status, raw_live = pipe.execute()
    status = None if raw_status is None else cast("GenerationStatus", _decode(raw_status))
    return status, None if raw_live is None else int(_decode(raw_live))


def processors_in_redis(client: redis.Redis, key_prefix: str) -> list[str]:
    """Every processor that has a generations registry in Redis, registered or not.

    One SCAN over the whole keyspace: callers that ask often cache the answer.
    """
    names = set()
    for key in scan_names(client, registries_pattern(key_prefix)):
        name = processor_of_registry_key(key, key_prefix)
        if name is not None:
            names.add(name)
    return sorted(names)


def starting_positions(meta: Mapping[str, str]) -> Positions:
    """Where a generation started, from its meta ``starting_offsets`` (Spark's JSON form).

    Empty when the generation started from ``earliest``/``latest`` or the field is unreadable.
    """
    return parse_offsets_json(meta.get("starting_offsets", "{}"), lenient=True)


def applied_records(positions: Positions, starting: Positions) -> int:
    """Offsets a generation has applied since it started (its positions past its start)."""
    return sum(o - starting.get(tp, 0) for tp, o in positions.items())


class GenerationRegistry:
    """The generations of one processor.

    Args:
        client: A redis-py client.
        layout: The processor's key layout.
    """

    def __init__(self, client: redis.Redis, layout: StateLayout) -> None:
        self.client = client
        self.layout = layout
        self._adopted = False  # checked on first use, not here: building one calls no Redis
        # Each generation's shard count, read from its meta once it exists (it never changes).
        self._shards: dict[int, int] = {}

    def _adopt_legacy_registry(self) -> None:
        """Rename a registry written before it had its hash tag (one EXISTS, once per registry).

        Called by the methods that read or write the registry's keys, so that its first Redis
        call is its caller's, inside whatever outage or refused-login handling the caller has.
        Only a single Redis can hold one: a cluster refused the untagged flip. RENAMENX, so of
        two processes adopting at once one renames and the other finds it done.
        """
        if self._adopted:
            return
        self._adopted = True
        legacy_alias, legacy_generations = self.layout.legacy_registry
        if is_cluster(self.client) or not self.client.exists(legacy_generations):
            return
        with self.client.pipeline(transaction=True) as pipe:
            pipe.renamenx(legacy_generations, self.layout.generations)
            pipe.renamenx(legacy_alias, self.layout.alias)
            pipe.execute(raise_on_error=False)  # an alias not made yet: nothing to rename
        logger.info("%s: registry keys renamed to their hash-tagged names", self.layout.processor)

    @classmethod
    def of(
        cls, client: redis.Redis, processor: str, key_prefix: str = DEFAULT_KEY_PREFIX
    ) -> GenerationRegistry:
        """The registry of ``processor``'s generations under ``key_prefix``."""
        return cls(client, StateLayout(processor, key_prefix))

    def keys(self, generation: int) -> GenerationKeys:
        """Key names of one generation, sharded as recorded (read once per registry).

        A generation whose shards are not recorded yet reads as unsharded, and is asked again
        next time (:meth:`decide_shards`).
        """
        shards = self._shards.get(generation)
        if shards is None:
            raw = self.client.hget(self.layout.generation(generation).meta, SHARDS_FIELD)
            shards = int(cast("bytes | None", raw) or 0)
            if raw:  # recorded (not "": a replay's, until its processor's first run decides)
                self._shards[generation] = shards
        return self.layout.generation(generation, shards)

    def one_transaction(self, keys: GenerationKeys) -> bool:
        """Whether one MULTI/EXEC can read every key of ``keys``' generation.

        Not a sharded generation on a Redis Cluster: its shards are in several slots, which no
        cluster transaction spans, so each shard's reads are a snapshot of that shard (its
        positions with its state).
        """
        return not (keys.shards and is_cluster(self.client))

    def decide_shards(self, generation: int, shards: int) -> int:
        """Record a generation's shards unless they are recorded; the recorded count.

        One script: of two processes deciding at once, the first one's count holds.
        """
        key = self.layout.generation(generation).meta
        recorded = self.client.eval(_DECIDE_SHARDS, 1, key, SHARDS_FIELD, str(shards))
        self._shards[generation] = int(cast("bytes", recorded))
        return self._shards[generation]

    def live(self) -> int | None:
        """The generation readers see, or ``None`` before the first one exists."""
        self._adopt_legacy_registry()
        value = self.client.get(self.layout.alias)
        return None if value is None else int(_decode(cast("bytes", value)))

    def list(self) -> list[GenerationInfo]:
        """Every generation, oldest first."""
        self._adopt_legacy_registry()
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.layout.generations))
        result = []
        for gen_raw, status in sorted(raw.items(), key=lambda kv: int(kv[0])):
            generation = int(gen_raw)
            result.append(
                GenerationInfo(
                    generation, cast("GenerationStatus", _decode(status)), self.meta(generation)
                )
            )
        return result

    def meta(self, generation: int) -> dict[str, str]:
        """The metadata hash of one generation (empty if it does not exist).

        With what its flips recorded (``live_since``, ``replaced``): they are kept in the
        registry's slot (``StateLayout.flips``), so that a flip is one transaction on a cluster.
        """
        fields = [f"{generation}:{name}" for name in _FLIP_FIELDS]
        # One round trip; not a transaction, which a cluster refuses across the two slots.
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.layout.generation(generation).meta)
            pipe.hmget(self.layout.flips, fields)
            raw, flipped = cast("tuple[dict[bytes, bytes], list[bytes | None]]", pipe.execute())
        meta = {_decode(k): _decode(v) for k, v in raw.items()}
        meta |= {
            name: _decode(value)
            for name, value in zip(_FLIP_FIELDS, flipped, strict=True)
            if value is not None
        }
        return meta

    def update_meta(self, generation: int, fields: dict[str, str]) -> None:
        """Set metadata fields of one generation."""
        if fields:
            mapping: dict[FieldT, EncodableT] = dict(fields.items())
            self.client.hset(self.layout.generation(generation).meta, mapping=mapping)

    def status(self, generation: int) -> GenerationStatus | None:
        """Status of one generation, ``None`` if it does not exist."""
        self._adopt_legacy_registry()
        value = self.client.hget(self.layout.generations, str(generation))
        return None if value is None else cast("GenerationStatus", _decode(cast("bytes", value)))

    def create(self, meta: dict[str, Any], *, live: bool = False) -> int:
        """Register a new generation with the next free number.

        Args:
            meta: Recorded in the generation's meta hash (non-strings are stored as JSON).
            live: Make it live at once (only for a processor's very first generation).

        Returns:
            The new generation number.
        """
        self._adopt_legacy_registry()
        while True:
            taken = [
                int(g) for g in cast("list[bytes]", self.client.hkeys(self.layout.generations))
            ]
            generation = max(taken, default=0) + 1
            status: GenerationStatus = "live" if live else "building"
            if self.client.hsetnx(self.layout.generations, str(generation), status):
                break
        fields: dict[FieldT, EncodableT] = {
            "created_at": str(int(time.time() * 1000)),
            SHARDS_FIELD: "0",  # unless ``meta`` says otherwise ("": decided at its first run)
            **{
                k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
                for k, v in meta.items()
            },
        }
        self.client.hset(self.layout.generation(generation).meta, mapping=fields)
        if live:
            self.client.set(self.layout.alias, str(generation))
        return generation

    def forget(self, generation: int) -> None:
        """Remove ``generation`` from the registry (gc, once its keys are gone)."""
        self._adopt_legacy_registry()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.layout.generations, str(generation))
            pipe.hdel(self.layout.flips, *(f"{generation}:{name}" for name in _FLIP_FIELDS))
            pipe.execute()

    def slots(self, generation: int) -> int:
        """The writer slots of a re-keyed generation (0: its entities are owned by partitions)."""
        return int(self.meta(generation).get(SLOTS_FIELD, "0"))

    def positions_of(self, generation: int, *, slots: int = 0) -> GenerationPositions:
        """The owner of ``generation``'s applied positions (``slots``: its writer slots)."""
        return GenerationPositions(self.client, self.keys(generation), slots)

    def set_positions(self, generation: int, positions: Mapping[str, int]) -> None:
        """Set where folding resumes (``topic/partition`` -> offset), for every writer slot too.

        A re-keyed generation's ``positions`` are the minimum over its slots' positions, so a
        reset moves the slots' positions with them (:meth:`GenerationPositions.set`).
        """
        self.positions_of(generation, slots=self.slots(generation)).set(positions)

    def positions(self, generation: int) -> Applied:
        """Applied positions (next offset per topic partition) and the last batch id."""
        return self.positions_of(generation).read()

    def flip(self, generation: int, *, record_replaced: bool = True) -> int | None:
        """Make ``generation`` live in one transaction; the previous live one is retired.

        ``record_replaced`` notes the previous generation in the new one's metadata, which is
        what ``replay rollback`` flips back to (a rollback itself does not record it).

        Readers resolve the alias with one GET, so they see either the old or the new generation,
        never a mix.

        Returns:
            The generation that was live before.

        Raises:
            RefoldError: ``generation`` does not exist.
        """
        self._adopt_legacy_registry()
        if self.status(generation) is None:
            msg = f"{self.layout.processor} has no generation {generation}"
            raise RefoldError(msg)
        previous = self.live()
        with self.client.pipeline(transaction=True) as pipe:
            self._queue_flip(pipe, generation, previous, record_replaced=record_replaced)
            pipe.execute()
        return previous

    def _queue_flip(
        self,
        pipe: redis.client.Pipeline,
        generation: int,
        previous: int | None,
        *,
        record_replaced: bool,
    ) -> None:
        pipe.set(self.layout.alias, str(generation))
        if previous is not None and previous != generation:
            pipe.hset(self.layout.generations, str(previous), "retired")
        pipe.hset(self.layout.generations, str(generation), "live")
        pipe.hset(self.layout.flips, f"{generation}:live_since", str(int(time.time() * 1000)))
        if record_replaced and previous is not None and previous != generation:
            pipe.hset(self.layout.flips, f"{generation}:replaced", str(previous))

    def keep_as_of(self, generation: int) -> bool:
        """Mark a ``building`` generation that reached its ending offsets ``as_of`` (no flip).

        Returns:
            False when it was no longer ``building`` (gc removed it, or it is marked already).
        """
        self._adopt_legacy_registry()
        key = self.layout.generations
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    raw = pipe.hget(key, str(generation))
                    if raw is None or _decode(cast("bytes", raw)) != "building":
                        pipe.unwatch()
                        return False
                    # The meta is in the generation's own slot (a cluster): written first.
                    self.update_meta(generation, {"bounded_at": str(int(time.time() * 1000))})
                    pipe.multi()
                    pipe.hset(key, str(generation), "as_of")
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    def flip_if_caught_up(
        self,
        generation: int,
        floor: Positions,
        slack: int = 0,
        *,
        starts: Positions | None = None,
    ) -> tuple[bool, int | None, Positions]:
        """Flip to ``generation`` only if readers lose no freshness by it, atomically.

        ``generation`` must be, on every partition, at or past both ``floor`` (e.g. the log end
        when the rebuild began) and the live generation's applied position, each less
        ``slack``. The check and the flip are one optimistic transaction (WATCH on the alias and
        both positions hashes): a batch committed in between makes it check again.
        ``starts`` is where the generation began on partitions it has written nothing for (a
        partition with no records past its starting point never gets a position).

        Returns:
            ``(flipped, previous live generation, how far behind per partition)``; the last
            is empty when it flipped.
        """
        self._adopt_legacy_registry()
        if self.status(generation) is None:
            msg = f"{self.layout.processor} has no generation {generation}"
            raise RefoldError(msg)
        applied = self.positions_of(generation)
        # One slot per WATCH on a cluster: there the positions are read just before the flip,
        # not watched, so a batch the live generation commits in that instant leaves the new
        # one up to that batch behind (consistency tokens wait it out; no state is wrong).
        watch_positions = not is_cluster(self.client)
        watched = [self.layout.alias, *(applied.watch_keys() if watch_positions else ())]
        reader: redis.Redis | redis.client.Pipeline = self.client
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*watched)  # type: ignore[no-untyped-call]
                    if watch_positions:
                        reader = pipe
                    raw_live = pipe.get(self.layout.alias)
                    previous = None if raw_live is None else int(cast("bytes", raw_live))
                    live_positions: Positions = {}
                    if previous is not None and previous != generation:
                        live = self.positions_of(previous)
                        if watch_positions:
                            pipe.watch(*live.watch_keys())  # type: ignore[no-untyped-call]
                        live_positions = live.read(via=reader).positions
                    mine = {**(starts or {}), **applied.read(via=reader).positions}
                    needed = dict(floor)
                    for tp, offset in live_positions.items():
                        needed[tp] = max(offset, needed.get(tp, 0))
                    behind = {
                        tp: need - mine.get(tp, 0)
                        for tp, need in needed.items()
                        if mine.get(tp, 0) + slack < need
                    }
                    if behind:
                        pipe.unwatch()
                        return False, previous, behind
                    pipe.multi()
                    self._queue_flip(pipe, generation, previous, record_replaced=True)
                    pipe.execute()
                    return True, previous, {}
                except redis.WatchError:
                    continue

    # -- processing lease: at most one processor per generation (contracts/store/lease.py) ----

    def lease_owner(self, generation: int) -> str | None:
        """Who holds ``generation``'s processing lease (``host:pid:nonce``), if anyone."""
        return lease_holder(self.client, self.layout.generation(generation).lease)

    def builder(self, generation: int) -> str | None:
        """Who holds ``generation``'s builder lease (the ``replay`` building it), if anyone."""
        return lease_holder(self.client, self.layout.generation(generation).builder)

    def runner(self, generation: int, status: str, meta: Mapping[str, str]) -> str:
        """Who folds ``generation`` (:func:`describe_runner`)."""
        return describe_runner(status, self.lease_owner(generation), meta, self.builder(generation))

    def abandoned(self) -> tuple[int, ...]:
        """The ``building`` generations nothing builds any more (:func:`is_abandoned`)."""
        return tuple(
            info.generation
            for info in self.list()
            if is_abandoned(
                info.status, self.lease_owner(info.generation), self.builder(info.generation)
            )
        )

    def claim_lease(self, generation: int, owner: str, ttl_ms: int) -> bool:
        """Take the lease if it is free (SET NX PX)."""
        return claim_lease(self.client, self.layout.generation(generation).lease, owner, ttl_ms)

    def release_lease(self, generation: int, owner: str) -> None:
        """Drop our lease (no-op when it is not ours)."""
        release_lease(self.client, self.layout.generation(generation).lease, owner)
