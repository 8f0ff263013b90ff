"""The fold's shared vocabulary: where a generation writes, and what a batch did.

Every engine of a processor (the fold envelope and its state kinds, the DataFrame and archive
sinks, the runner) speaks of a :class:`FoldTarget` and a :class:`BatchOutcome`; they live here,
below all of them, so that none imports another engine to name them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import redis

from refold.contracts.fingerprints import NOTHING_DECLARED, DeclaredCode
from refold.contracts.layout import GenerationKeys, StateLayout
from refold.contracts.processors import EventId, EventTime, StateTtl
from refold.contracts.store.positions import GenerationPositions
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.output_topics import late_topic

__all__ = ["BatchOutcome", "FoldTarget", "PendingRecord", "add_outcome"]

# A record that decoded and is on time, ready for its kind of state: the record, its event type,
# its event, and its entity (an entity fold's key; "" for a window or lookup fold).
PendingRecord = tuple[SourceRecord, str, dict[str, Any], str]


def add_outcome(into: Any, other: Any) -> None:
    """Add the outcome ``other`` into ``into`` (two outcome dataclasses of one kind).

    Counters (``int`` fields) add up, ``positions`` take the later value of each partition,
    and any other mapping (dead letters per reason) adds up per key. Derived from the fields,
    so a counter added to an outcome is merged with no other edit.
    """
    for spec in dataclasses.fields(into):
        mine, theirs = getattr(into, spec.name), getattr(other, spec.name)
        if isinstance(mine, int):
            setattr(into, spec.name, mine + theirs)
        elif spec.name == "positions":
            mine.update(theirs)
        else:
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count


@functools.lru_cache(maxsize=1024)
def _keys(
    prefix: str, processor: str, generation: int, shards: int, shard: int | None
) -> GenerationKeys:
    """The keys a target names, made once: the fold asks for them per entity."""
    keys = StateLayout(processor, prefix).generation(generation, shards)
    return keys if shard is None else keys.for_shard(shard)


@dataclass(frozen=True, slots=True)
class FoldTarget:
    """Where a processor generation writes. Picklable; shipped to executors.

    Attributes:
        processor: Processor name.
        generation: Generation number.
        redis_url: redis-py URL.
        key_prefix: Prefix of refold's Redis keys.
        kafka: librdkafka settings of the dead-letter producer (and of the reads that fold
            a range again which Redis lost).
        dlq_topic: Dead-letter topic.
        check_keys: Dead-letter records whose Kafka key is not their entity key (reason
            ``key-mismatch``): such a record may sit on another partition than the rest of its
            entity, where another writer folds it. For a re-keyed processor: whose Kafka key
            is not the value of its topic's partition key field.
        slots: 0 when entities are owned by partitions (the key is every topic's partition
            key); otherwise the number of writer slots that own the entities of a re-keyed
            processor (:mod:`refold.processors.fold.rekey`), fixed for the generation.
        key_field: The entity key field (re-keyed processors).
        key_links: ``via`` fields that link events without the key to it (re-keyed).
        partition_keys: ``(topic, partition key field)`` of each topic (re-keyed).
        event_time: The processor's event time (lateness is judged per partition), if any.
        topics: The processor's topics (an entity's timers fire on the watermark of its
            partition id over all of them).
        code_fingerprint: The driver's code fingerprint: a Spark worker that loaded other code
            (the file edited under the running process) refuses to write ("": unchecked).
        declared_code: What the processor's spec declares about its code (its fingerprint
            covers it): a worker recomputes the fingerprint with it.
        archive_root: The archive whose files serve the records below a partition's log
            start (:mod:`refold.processors.runtime.archive.cold_tier`); "": none.
        created_at: The generation's ``created_at`` (registry meta). It names the output
            streams, so a generation number that gc frees and a new generation takes again
            starts new streams and markers.
        dedupe: De-duplication by event id (entity folds): each entity skips an event whose
            id is among those of its latest ``horizon`` applied events.
        state_ttl: State that expires (entity folds with an event time): an entity with no
            event for that long in event time is removed (:mod:`refold.processors.fold.expiry`).
        marked: The output streams this processor writes watermark markers to:
            ``(topic, event-time field)`` of each effect topic whose spec has an event-time
            field (:mod:`refold.contracts.watermarks`).
        streams: How many streams it has (its topics' partitions, times its writer slots
            when re-keyed): a marker's ``of``.
        stream_topics: Its topics that carry markers (another processor's output streams):
            lateness there is judged per upstream stream
            (:class:`~refold.processors.fold.stream_clocks.StreamClocks`).
        shards: 0, or the partition count of a generation sharded by partition id on a
            Redis Cluster (``GenerationKeys.shards``): each partition id's transactions write
            under its own hash tag.
        shard: The shard (partition id) a writer of a sharded generation writes; ``None``:
            the whole generation (:attr:`keys` then name its own keys).
        output_floor: ``(topic, partition, offset)``: how far the processor's generations had
            committed outputs when the query started (their marker groups in Kafka,
            :func:`~refold.processors.runtime.sent_outputs.committed_floor`). The side
            effects of records below it are not sent again, whatever Redis lost.
    """

    processor: str
    generation: int
    # Both may hold credentials (a Redis password, sasl.password): never in a repr or a log.
    redis_url: str = field(repr=False)
    key_prefix: str
    kafka: tuple[tuple[str, str], ...] = field(repr=False)
    dlq_topic: str
    check_keys: bool = True
    slots: int = 0
    key_field: str = ""
    key_links: tuple[str, ...] = ()
    partition_keys: tuple[tuple[str, str], ...] = ()
    event_time: EventTime | None = None
    topics: tuple[str, ...] = ()
    code_fingerprint: str = ""
    declared_code: DeclaredCode = NOTHING_DECLARED
    archive_root: str = ""
    dedupe: EventId | None = None
    state_ttl: StateTtl | None = None
    created_at: str = ""
    marked: tuple[tuple[str, str], ...] = ()
    streams: int = 0
    stream_topics: tuple[str, ...] = ()
    shards: int = 0
    shard: int | None = None
    output_floor: tuple[tuple[str, int, int], ...] = ()

    @property
    def late_topic(self) -> str:
        """Where late records go under the ``side-output`` policy."""
        return late_topic(self.processor, self.event_time)

    @property
    def layout(self) -> StateLayout:
        """The processor's Redis keys."""
        return StateLayout(self.processor, self.key_prefix)

    @property
    def keys(self) -> GenerationKeys:
        """The generation's Redis keys (of its shard, when a writer of a sharded one)."""
        return _keys(self.key_prefix, self.processor, self.generation, self.shards, self.shard)

    def positions(self, client: redis.Redis) -> GenerationPositions:
        """The generation's applied positions, read and written through ``client``."""
        return GenerationPositions(client, self.keys, self.slots)


@dataclass(slots=True)
class BatchOutcome:
    """What one :meth:`FoldWriter.apply` call did."""

    records: int = 0
    applied: int = 0
    skipped: int = 0
    rejected: int = 0
    undecodable: int = 0
    positions: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    suppressed: int = 0
    # Letters a building generation did not send: the live generation sent them already.
    suppressed_letters: int = 0
    late: int = 0
    duplicates: int = 0
    # Entities the state TTL removed (``state_ttl``).
    expired: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    # Records of event types the processor does not declare: passed by, neither folded nor
    # dead-lettered, and no part of event time (a topic carries other processors' types too).
    passed: int = 0

    def merge(self, other: BatchOutcome) -> None:
        """Add another outcome (from another task) into this one."""
        add_outcome(self, other)

    def describe(self) -> str:
        """One line for the log, once a query has stopped."""
        return (
            f"{self.records} records, {self.applied} applied, {self.passed} passed by "
            f"(types it does not fold), {self.rejected} rejected, "
            f"{self.undecodable} undecodable"
        )
