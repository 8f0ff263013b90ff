"""The Redis state layout: generations, the live alias, applied positions, tables.

Every key of one generation shares a Redis Cluster hash tag (``{processor.gN}``), so the
sink's single MULTI/EXEC that writes state and positions together also works on a cluster. A
processor's registry keys (alias, generations, flips) share the tag ``{processor}``, so a
cutover stays one atomic flip there too.

=========================================  ======  =============================================
key                                         type    content
=========================================  ======  =============================================
``<p>:{<proc>}:live``                       string  live generation number (the alias)
``<p>:{<proc>}:generations``                hash    generation -> status (building/live/
                                                    retired/as_of)
``<p>:{<proc>}:flips``                      hash    ``<N>:live_since`` (epoch ms), ``<N>:replaced``
                                                    (the generation N replaced), set by the flip
``<p>:<proc>:dlq:redriven``                 hash    ``<topic>/<p>@<offset>`` -> JSON: a dead
                                                    letter's record ``refold dlq redrive`` sent
                                                    back (``pending`` or ``sent``); no state
``<p>:<proc>:dl:sent``                      hash    ``<topic>/<p>@<offset>.<n>|<reason>`` ->
                                                    the generation that sent that dead letter (or
                                                    late record), over every generation; field
                                                    ``~recovered``: when it was read back from the
                                                    dead-letter topics (a Redis found empty); no
                                                    state: gc and resets keep it
``<p>:{<proc>.g<N>}:meta``                  hash    created_at, starting_offsets, fingerprints
``<p>:{<proc>.g<N>}:positions``             hash    ``<topic>/<partition>`` -> next offset to
                                                    apply; ``batch_id`` -> last Spark batch
``<p>:{<proc>.g<N>}:guard:<topic>/<part>``  string  same offset; WATCHed by the partition's writer
``<p>:{<proc>.g<N>}:lease``                 string  ``host:pid:nonce`` of the processor running it
                                                    (expires unless renewed)
``<p>:{<proc>.g<N>}:builder``               string  ``host:pid:nonce`` of the ``replay`` building
                                                    it (expires unless renewed; gone: abandoned)
``<p>:{<proc>.g<N>}:t:<table>:<key>``       string  one entity's state, JSON
``<p>:{<proc>.g<N>}:a:<aggregate>``         hash    aggregate counters (integers)
``<p>:{<proc>.g<N>}:dd:<table>:<key>``      string  de-duplication: the ids of the entity's
                                                    latest applied events, JSON list
``<p>:{<proc>.g<N>}:slotpos:<s>``           hash    re-keyed: writer slot s's positions
``<p>:{<proc>.g<N>}:guard:slot:<s>``        string  re-keyed: WATCHed by slot s's writer
``<p>:{<proc>.g<N>}:k:<via>``               hash    re-keyed: ``via`` value -> offset:entity
``<p>:{<proc>.g<N>}:w:<win>:<start>:<grp>`` hash    one window bucket: ``count``, ``sum:<m>``,
                                                    ``min:<m>``, ``max:<m>`` (integers)
``<p>:{<proc>.g<N>}:wd:<win>:<d>:<st>:<grp>``
                                            string  HyperLogLog: distinct ``d`` of a bucket
``<p>:{<proc>.g<N>}:tm:<timers>``           zset    timer -> due event time (ms): ``close`` (a
                                                    window end), ``expire`` (end + retention),
                                                    ``p:<partition id>`` (entity -> its due),
                                                    re-keyed ``s:<slot>`` (a slot's entities)
``<p>:{<proc>.g<N>}:tm:ttl:<grp>``          zset    ``state_ttl``: entity -> its expiry (largest
                                                    event time applied + TTL, ms): ``p:<partition
                                                    id>``, re-keyed ``s:<slot>``
``<p>:{<proc>.g<N>}:wm:clocks``             hash    ``[s<slot>|]<topic>/<partition>`` -> largest
                                                    event time seen on it (ms), with the
                                                    positions (re-keyed: each slot's own copy;
                                                    the plain field is their minimum)
``<p>:{<proc>.g<N>}:om:marks``              hash    ``[s<slot>|]<topic>/<p>|<stream>`` -> highest
                                                    origin ``<offset>.<index>`` applied
``<p>:{<proc>.g<N>}:dl:letters``            hash    ``<topic>/<p>@<offset>.<n>`` -> reason of
                                                    each dead letter (and late record) it
                                                    decided: a rebuild sends each once
``<p>:{<proc>.g<N>}:scratch:<i>``           string  a script's scratch keys: it counts the union
                                                    of a sharded window processor's sketches;
                                                    gone when it returns (``store.sketches``)
``<p>:{<proc>.g<N>}:stats``                 hash    what its micro-batches did (not state):
                                                    ``batches``, ``events``, ``duplicates``,
                                                    ``effects``, ``dead:<reason>``,
                                                    ``dur_le:<ms>``, ``dur_sum_ms``,
                                                    ``last_batch_id``, ``last_batch_at``,
                                                    ``checkpoint_id``, ``watermark_ms``
                                                    (:mod:`refold.contracts.store.stats`)
=========================================  ======  =============================================

Window buckets are named by window, start (epoch ms) and group, the group last: it is user data
and may hold any character.

A generation sharded by partition id (``GenerationKeys.shards``) names the keys its
transactions write (positions, guards, ``t:``, ``dd:``, ``a:``, ``tm:``, ``w:``, ``wd:``, ``wm:``,
``om:``, ``dl:``, stats) with its shard's tag, ``{<proc>.g<N>.s<partition>[.<n>]}``
(:func:`shard_tag`), in place of ``{<proc>.g<N>}``; meta and the leases keep the generation's
tag. A sharded window processor's shard holds its partition id's share of each bucket, sketch
and close timer: readers and the closer merge the shards.

The keys of the services (webhooks, API keys, HTTP ingest) are no processor's state:
:mod:`refold.contracts.service_keys` declares them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

__all__ = [
    "BATCH_ID_FIELD",
    "DEFAULT_KEY_PREFIX",
    "RESULT_NAMESPACES",
    "STATE_LAYOUT_VERSION",
    "STATE_NAMESPACES",
    "GenerationKeys",
    "GenerationStatus",
    "StateLayout",
    "parse_position_field",
    "position_field",
    "processor_of_registry_key",
    "registries_pattern",
    "shard_tag",
]

DEFAULT_KEY_PREFIX = "refold"
# Bumped whenever the layout below changes: part of every generation's code fingerprint.
STATE_LAYOUT_VERSION = 1
BATCH_ID_FIELD = "batch_id"
# Every kind of key that makes up a generation's state, by namespace: snapshots, in-place resets,
# ``replay diff`` and gc derive their key lists from this (with ``positions``), so a kind declared
# here is never left out. t: entity tables, a: aggregate hashes, guard: writer guards,
# slotpos: re-keyed writer slots' positions, k: re-keying links, w: window buckets, wd: their
# distinct-count sketches, tm: timers, wm: event-time clocks, om: origin marks (the highest
# sequence applied per upstream output stream: a chained processor skips re-sent records),
# dl: the dead letters it decided (a rebuild does not send the live generation's again), dd:
# the ids of each entity's latest events (de-duplication by event id).
STATE_NAMESPACES = (
    *("t:", "a:", "guard:", "slotpos:", "k:", "w:", "wd:", "tm:", "wm:", "om:", "dl:", "dd:"),
    "x:",  # the keys of state kinds added as modules (GenerationKeys.kind_key)
)
# The namespaces ``replay diff`` compares (the rest are the envelope's internals).
RESULT_NAMESPACES = ("t:", "a:", "w:", "wd:")
# as_of: a generation bounded at a moment (replay --until), kept beside the live one, never
# flipped to, removed by gc only when asked.
GenerationStatus = Literal["building", "live", "retired", "as_of"]


def position_field(topic: str, partition: int) -> str:
    """The positions-hash field of one topic partition."""
    return f"{topic}/{partition}"


def parse_position_field(field: str) -> tuple[str, int] | None:
    """Inverse of :func:`position_field`; ``None`` for the non-position fields.

    A field with ``|`` is none: a writer slot's copy (``s<slot>|<topic>/<p>``) or a stream's
    clock (``<topic>/<p>|<stream>``) in a clocks hash. Kafka topic names have no ``|``.
    """
    if "|" in field:
        return None
    topic, sep, partition = field.rpartition("/")
    if not sep or not (partition.isascii() and partition.isdigit()):
        return None
    return topic, int(partition)


@functools.lru_cache(maxsize=4096)
def shard_tag(processor: str, generation: int, shard: int, shards: int) -> str:
    """The hash tag of shard ``shard`` of a generation sharded ``shards`` ways.

    A shard is a Kafka partition id (a co-partitioned processor) or a writer slot (re-keyed):
    everything one transaction writes. Its tag is ``<proc>.g<N>.s<shard>``, with a suffix
    ``.<n>`` (the first n that fits) that puts its Redis Cluster slot at the middle of the
    shard's share of the 16,384 slots (within 1/128 of the share, and 8 slots, either side).
    A cluster gives each of its M masters a contiguous run of slots, so shard i lands on
    master ``floor((i + 1/2) * M / shards)``: each master holds the floor or the ceiling of
    ``shards / M`` shards (8 on 3 masters: 3, 2 and 3), where tags hashed at random put 5 of
    8 on one now and then. Pure, so every reader computes the same tag.
    """
    share = REDIS_CLUSTER_HASH_SLOTS / shards
    middle = (shard + 0.5) * share
    half = max(share / 128, min(share / 2, 8.0))
    base = f"{processor}.g{generation}.s{shard}"
    suffix = 0
    while True:
        tag = base if suffix == 0 else f"{base}.{suffix}"
        if abs(key_slot(tag.encode()) + 0.5 - middle) <= half:
            return tag
        suffix += 1


@functools.lru_cache(maxsize=256)
def _generation_tags(processor: str, generation: int, shards: int) -> frozenset[str]:
    """The hash tags of a generation: its own, and each shard's."""
    own = f"{processor}.g{generation}"
    return frozenset({own, *(shard_tag(processor, generation, s, shards) for s in range(shards))})


@dataclass(frozen=True, slots=True)
class GenerationKeys:
    """The keys of one generation of one processor.

    A sharded generation (``shards`` > 0, a Redis Cluster) keeps what each shard's transaction
    writes (positions, guards, state, stats, letters, clocks) under the shard's own hash tag
    (:func:`shard_tag`), and the rest (meta, leases, snapshots) under the generation's.
    ``shard`` picks the shard these keys name (:meth:`for_shard`); ``None``: the generation's
    own keys. An unsharded generation (``shards`` = 0, the default) is one hash tag.
    """

    prefix: str
    processor: str
    generation: int
    shards: int = 0
    shard: int | None = None

    @property
    def home(self) -> str:
        """The generation's own prefix (meta, leases, snapshots), with its hash tag."""
        return f"{self.prefix}:{{{self.processor}.g{self.generation}}}"

    @property
    def base(self) -> str:
        """Common prefix of these keys, with the cluster hash tag (the shard's, if one)."""
        if self.shard is None:
            return self.home
        tag = shard_tag(self.processor, self.generation, self.shard, self.shards)
        return f"{self.prefix}:{{{tag}}}"

    def for_shard(self, shard: int) -> GenerationKeys:
        """The keys of shard ``shard`` (the partition id or writer slot); unsharded: these."""
        if not self.shards:
            return self
        if not 0 <= shard < self.shards:
            msg = f"shard {shard} of a generation with {self.shards} shards"
            raise ValueError(msg)
        return dataclasses.replace(self, shard=shard)

    def each_shard(self) -> list[GenerationKeys]:
        """The keys of every shard (one element, these keys, when unsharded)."""
        if not self.shards:
            return [self]
        return [self.for_shard(s) for s in range(self.shards)]

    @property
    def meta(self) -> str:
        """Hash of generation metadata."""
        return f"{self.home}:meta"

    @property
    def positions(self) -> str:
        """Hash of applied source positions (next offset per partition) and the batch id."""
        return f"{self.base}:positions"

    def positions_hashes(self) -> list[str]:
        """Every hash holding positions: the generation's, or each shard's.

        Of a shard's keys (:meth:`for_shard`), that shard's hash alone.
        """
        if self.shards and self.shard is None:
            return [k.positions for k in self.each_shard()]
        return [self.positions]

    @property
    def lease(self) -> str:
        """The processing lease: at most one processor runs a generation at a time."""
        return f"{self.home}:lease"

    @property
    def writers(self) -> str:
        """Set of the ``transactional.id`` of every output writer of the generation.

        A writer adds its id before its first Kafka transaction; a processor that takes the
        generation's lease fences them (``refold.processors.runtime.output_transactions``).
        """
        return f"{self.home}:writers"

    @property
    def builder(self) -> str:
        """The builder lease: the ``replay`` building this generation holds it until the flip.

        A ``building`` generation whose builder lease and processing lease are both gone was
        abandoned (its replay was killed): status says so, ``replay gc`` removes it.
        """
        return f"{self.home}:builder"

    @property
    def stats(self) -> str:
        """Hash of processing stats: counts in the engines' transactions, batches by the driver.

        Not state (see :meth:`is_state_key`): snapshots and ``replay diff`` leave it out; gc
        removes it with the generation (:meth:`pattern`) and an in-place reset deletes it, as
        the generation's Spark batch ids start again (:mod:`refold.contracts.store.stats`).
        """
        return f"{self.base}:stats"

    @property
    def dead_letters(self) -> str:
        """Hash of the dead letters this generation decided: origin field -> reason.

        Written with the positions, so it holds exactly the letters of the applied records
        (:mod:`refold.processors.runtime.dead_letter_index`).
        """
        return f"{self.base}:dl:letters"

    def guard(self, position_field: str) -> str:
        """Per-partition guard key, WATCHed by the partition's writer.

        Writers watch only the guards of their own partitions, so two tasks of one batch
        (disjoint partitions) never make each other's transaction fail.
        """
        return f"{self.base}:guard:{position_field}"

    def slot_positions(self, slot: int) -> str:
        """Hash of one writer slot's applied positions (re-keyed processors).

        ``<topic>/<partition>`` -> next offset: every record of the partition below it whose
        entity belongs to the slot is applied. The generation's ``positions`` hold the minimum
        over the slots, so everything reads a re-keyed generation as any other.
        """
        return f"{self.base}:slotpos:{slot}"

    def slot_guard(self, slot: int) -> str:
        """Guard key of one writer slot, WATCHed by the slot's writer."""
        return f"{self.base}:guard:slot:{slot}"

    def links(self, via: str) -> str:
        """Hash of the links of a re-keyed processor: ``via`` value -> ``<offset>:<entity>``."""
        return f"{self.base}:k:{via}"

    def table(self, table: str, key: str) -> str:
        """One entity's state in ``table``."""
        return f"{self.base}:t:{table}:{key}"

    def seen_ids(self, table: str, key: str) -> str:
        """The ids of the latest events one entity of ``table`` applied (de-duplication)."""
        return f"{self.base}:dd:{table}:{key}"

    def table_pattern(self, table: str) -> str:
        """SCAN pattern matching every entity of ``table``."""
        return f"{self.base}:t:{table}:*"

    def aggregate(self, name: str) -> str:
        """Hash of one aggregate's counters."""
        return f"{self.base}:a:{name}"

    def kind_key(self, kind: str, name: str) -> str:
        """A key of a state kind added as a module (``refold.processors.runtime.kinds``).

        Under the ``x:`` namespace, so snapshots, seeding, in-place resets and gc take it with
        the rest of the state without knowing the kind.
        """
        return f"{self.base}:x:{kind}:{name}"

    def kind_pattern(self, kind: str) -> str:
        """SCAN pattern of every key of one added state kind."""
        return f"{self.base}:x:{kind}:*"

    def window_bucket(self, window: str, start: int, group: str) -> str:
        """Hash of one window bucket's aggregates (``count``, ``sum:<m>``, ``min:<m>``...)."""
        return f"{self.base}:w:{window}:{start}:{group}"

    def window_pattern(self, window: str) -> str:
        """SCAN pattern matching every bucket of ``window``."""
        return f"{self.base}:w:{window}:*"

    def window_distinct(self, window: str, measure: str, start: int, group: str) -> str:
        """HyperLogLog of the distinct values of ``measure`` in one window bucket."""
        return f"{self.base}:wd:{window}:{measure}:{start}:{group}"

    def parse_window_bucket(self, name: str) -> tuple[str, int, str] | None:
        """``(window, start, group)`` of a :meth:`window_bucket` key (``None``: not one)."""
        head = f"{self.base}:w:"
        if not name.startswith(head):
            return None
        window, sep, rest = name[len(head) :].partition(":")
        start, sep2, group = rest.partition(":")  # the group is last and may hold ':'
        if not (sep and sep2 and start.lstrip("-").isdigit()):
            return None
        return window, int(start), group

    def parse_window_distinct(self, name: str) -> tuple[str, str, int, str] | None:
        """``(window, measure, start, group)`` of a :meth:`window_distinct` key."""
        head = f"{self.base}:wd:"
        if not name.startswith(head):
            return None
        parts = name[len(head) :].split(":", 3)
        if len(parts) != 4 or not parts[2].lstrip("-").isdigit():
            return None
        return parts[0], parts[1], int(parts[2]), parts[3]

    def scratch(self, name: str) -> str:
        """Prefix of a script's scratch keys, in the generation's own slot (never state)."""
        return f"{self.home}:scratch:{name}"

    def namespace_pattern(self, namespace: str) -> str:
        """SCAN pattern matching every key of one of :data:`STATE_NAMESPACES`."""
        return f"{self.base}:{namespace}*"

    def timers(self, name: str) -> str:
        """Sorted set of timers (member -> due event time in ms)."""
        return f"{self.base}:tm:{name}"

    def entity_timers(self, partition: int) -> str:
        """Sorted set of the entity timers of partition id ``partition`` (entity -> due ms)."""
        return f"{self.base}:tm:p:{partition}"

    def slot_timers(self, slot: int) -> str:
        """Re-keyed: sorted set of the entity timers of writer slot ``slot`` (entity -> due ms)."""
        return f"{self.base}:tm:s:{slot}"

    def entity_expiries(self, partition: int) -> str:
        """``state_ttl``: sorted set of partition id ``partition``'s entities -> expiry (ms)."""
        return f"{self.base}:tm:ttl:p:{partition}"

    def slot_expiries(self, slot: int) -> str:
        """``state_ttl``, re-keyed: sorted set of writer slot ``slot``'s entities -> expiry."""
        return f"{self.base}:tm:ttl:s:{slot}"

    @property
    def clocks(self) -> str:
        """Hash of the largest event time seen per partition (moves with the positions)."""
        return f"{self.base}:wm:clocks"

    @property
    def origin_marks(self) -> str:
        """Hash of the highest origin sequence applied per upstream output stream.

        Fields ``[s<slot>|]<topic>/<partition>|<stream>`` -> ``<offset>.<index>``: per source
        partition (and writer slot), see :mod:`refold.contracts.origin`. Moves with the positions,
        under their guard.
        """
        return f"{self.base}:om:marks"

    def pattern(self) -> str:
        """SCAN pattern matching every key under these keys' tag (the shard's, if one)."""
        return f"{self.base}:*"

    def patterns(self) -> list[str]:
        """SCAN patterns matching every key of the generation: its own, then each shard's."""
        shards = [k.pattern() for k in self.each_shard() if k.shard is not None]
        return [f"{self.home}:*", *shards]

    def is_state_key(self, name: str) -> bool:
        """True for the keys that make up the state: tables, aggregates, positions, guards.

        (Not the meta hash, the leases, the writers, the stats, nor snapshots.) Of any shard of
        the generation, whichever shard these keys name.
        """
        head = f"{self.prefix}:{{"
        end = name.find("}:", len(head))
        if not name.startswith(head) or end < 0:
            return False
        if name[len(head) : end] not in _generation_tags(
            self.processor, self.generation, self.shards
        ):
            return False
        rest = name[end + 2 :]
        return rest == "positions" or rest.startswith(STATE_NAMESPACES)


@dataclass(frozen=True, slots=True)
class StateLayout:
    """The keys of one processor across its generations.

    Args:
        processor: Processor name, e.g. ``order_state``.
        prefix: Key prefix shared by all of refold (tests use a unique one each).
    """

    processor: str
    prefix: str = DEFAULT_KEY_PREFIX

    @property
    def registry_base(self) -> str:
        """Common prefix of the registry keys, with the processor's hash tag."""
        return f"{self.prefix}:{{{self.processor}}}"

    @property
    def alias(self) -> str:
        """The live-generation alias: readers resolve the generation through it."""
        return f"{self.registry_base}:live"

    @property
    def generations(self) -> str:
        """Hash generation -> status."""
        return f"{self.registry_base}:generations"

    @property
    def flips(self) -> str:
        """Hash ``<N>:live_since`` and ``<N>:replaced``: what each flip did, in the alias' slot."""
        return f"{self.registry_base}:flips"

    @property
    def legacy_registry(self) -> tuple[str, str]:
        """``(alias, generations)`` as written before the registry had a hash tag."""
        return f"{self.prefix}:{self.processor}:live", f"{self.prefix}:{self.processor}:generations"

    @property
    def redriven(self) -> str:
        """Hash origin -> what ``refold dlq redrive`` did with its record (every generation's)."""
        return f"{self.prefix}:{self.processor}:dlq:redriven"

    @property
    def letters_sent(self) -> str:
        """Hash ``<origin>.<n>|<reason>`` -> generation: every dead letter sent, by any generation.

        Not a generation's state (gc, resets and snapshots leave it): what went out to the
        dead-letter and late topics stays sent whichever generation is live.
        """
        return f"{self.prefix}:{self.processor}:dl:sent"

    def generation(self, generation: int, shards: int = 0) -> GenerationKeys:
        """The keys of generation ``generation`` (sharded ``shards`` ways; 0: one hash tag)."""
        return GenerationKeys(self.prefix, self.processor, generation, shards)


def registries_pattern(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """SCAN pattern matching every processor's generations hash (to find processors in Redis).

    It matches the registries written before they had a hash tag too.
    """
    return f"{prefix}:*:generations"


def processor_of_registry_key(key: str, prefix: str = DEFAULT_KEY_PREFIX) -> str | None:
    """The processor whose generations hash ``key`` is (inverse of ``StateLayout.generations``)."""
    head, tail = f"{prefix}:", ":generations"
    if not (key.startswith(head) and key.endswith(tail)):
        return None
    name = key[len(head) : -len(tail)]
    if name.startswith("{") and name.endswith("}"):
        name = name[1:-1]  # else a registry written before it had a hash tag
    return name if name and not any(c in name for c in ":{}") else None
