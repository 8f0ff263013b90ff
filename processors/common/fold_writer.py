"""Decode -> fold -> one Redis transaction: the exactly-once heart of every processor.

:meth:`FoldWriter.apply` takes the records of one Kafka partition range (or several) and writes
the changed entity states, the aggregate deltas and the new source positions in ONE MULTI/EXEC,
guarded by WATCH on the guard keys of its partitions. Records below a partition's applied
position are skipped,
so a re-executed Spark batch, a crash between sink and checkpoint or an overlapping replay range
changes nothing. A concurrent writer (a zombie task) makes EXEC fail and the batch is re-planned.

Entities are not watched (it cost ~5 us per record): an entity must live on one partition, which
the producer SDK guarantees by keying every event with its aggregate id.

Records that do not decode or that the fold rejects go to the dead-letter topic, with the reason
and origin in headers, before the transaction commits: nothing is lost. A dead letter can be
written twice if the process dies between the two steps (dead letters are at-least-once).

Lifecycle: a FoldWriter is picklable before first use and opens its Redis client and dead-letter
producer lazily, in the process that calls :meth:`apply` (a Spark executor's Python worker).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import orjson
import redis
from confluent_kafka import KafkaError, Message, Producer
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from contracts.codec import EventCodec
from contracts.errors import DeserializationError
from contracts.state import BATCH_ID_FIELD, GenerationKeys, StateLayout, position_field
from processors.common.projection import (
    EventRejectedError,
    Projection,
    SideEffect,
    State,
    effects_of,
)
from processors.errors import DeadLetterError, SinkConflictError

__all__ = ["BatchOutcome", "FoldTarget", "FoldWriter", "SourceRecord"]

logger = logging.getLogger(__name__)

# WATCH conflicts only happen with a concurrent writer of the same generation; a few re-plans
# resolve a transient overlap, more means two live processors share a generation.
_MAX_ATTEMPTS = 5


class SourceRecord(NamedTuple):
    """One Kafka record as the source hands it over."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class FoldTarget:
    """Where a processor generation writes. Picklable; shipped to executors.

    Attributes:
        processor: Processor name.
        generation: Generation number.
        redis_url: redis-py URL.
        key_prefix: Prefix of refold's Redis keys.
        kafka: librdkafka settings of the dead-letter producer.
        dlq_topic: Dead-letter topic.
    """

    processor: str
    generation: int
    redis_url: str
    key_prefix: str
    kafka: tuple[tuple[str, str], ...]
    dlq_topic: str

    @property
    def layout(self) -> StateLayout:
        """The processor's Redis keys."""
        return StateLayout(self.processor, self.key_prefix)

    @property
    def keys(self) -> GenerationKeys:
        """The generation's Redis keys."""
        return self.layout.generation(self.generation)


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

    def merge(self, other: BatchOutcome) -> None:
        """Add another outcome (from another task) into this one."""
        self.records += other.records
        self.applied += other.applied
        self.skipped += other.skipped
        self.rejected += other.rejected
        self.undecodable += other.undecodable
        self.positions.update(other.positions)
        self.effects += other.effects
        self.suppressed += other.suppressed


@dataclass(frozen=True, slots=True)
class _DeadLetter:
    record: SourceRecord
    reason: str
    detail: str


def _await_acks(producer: Producer, failures: list[str], what: str) -> None:
    """Flush, and fail the batch (before its commit) unless every record was acknowledged."""
    remaining = producer.flush(30)
    if remaining or failures:
        msg = (
            f"{len(failures) or remaining} of {what} not acknowledged "
            f"({'; '.join(failures[:3]) or 'timeout'}); batch not applied"
        )
        raise DeadLetterError(msg)


class FoldWriter:
    """Applies record batches of one processor generation to Redis, exactly once in effect.

    Args:
        target: Where to write.
        projection: The pure fold.
        codec: Contract codec; default the shipped schemas, newest version as reader.
    """

    def __init__(
        self, target: FoldTarget, projection: Projection, codec: EventCodec | None = None
    ) -> None:
        self.target = target
        self.projection = projection
        self.codec = codec or EventCodec()
        self._redis: redis.Redis | None = None
        self._producer: Producer | None = None
        self._has_effects = getattr(projection, "effects", None) is not None

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (created on first use)."""
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.target.redis_url)
        return self._redis

    def _dead_letter_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    "acks": "all",
                    "enable.idempotence": "true",
                    "partitioner": "murmur2_random",
                    "linger.ms": "5",
                    **dict(self.target.kafka),
                }
            )
        return self._producer

    def connect(self) -> None:
        """Connect to Redis and start the producer's handshake now rather than at first use.

        The idempotent producer's first flush waits for metadata and a producer id (~0.45 s on
        the local broker); started before a task reads its records, that overlaps the read.
        """
        self._dead_letter_producer().poll(0)
        self.redis.ping()

    def apply(self, records: Sequence[SourceRecord], batch_id: int | None = None) -> BatchOutcome:
        """Fold ``records`` into the generation and record their positions, atomically.

        Args:
            records: Records of one or more partitions, each partition's in offset order.
            batch_id: Spark batch id, stored with the positions for diagnosis.

        Returns:
            Counts and the new positions (``topic/partition`` -> next offset).

        Raises:
            SinkConflictError: The positions kept changing under us.
            DeadLetterError: The dead-letter topic did not acknowledge a record.
        """
        keys = self.target.keys
        fields = sorted({position_field(r.topic, r.partition) for r in records})
        for _attempt in range(_MAX_ATTEMPTS):
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*(keys.guard(f) for f in fields))  # type: ignore[no-untyped-call]
                    return self._apply_once(pipe, records, fields, batch_id)
                except redis.WatchError:
                    logger.warning(
                        "positions changed during the batch; re-planning",
                        extra={"batch_id": batch_id, "generation": self.target.generation},
                    )
        msg = (
            f"{self.target.processor} g{self.target.generation}: positions changed "
            f"{_MAX_ATTEMPTS} times during one batch. Operator action: make sure only one "
            "processor runs per generation."
        )
        raise SinkConflictError(msg)

    def _apply_once(
        self,
        pipe: Pipeline,
        records: Sequence[SourceRecord],
        fields: list[str],
        batch_id: int | None,
    ) -> BatchOutcome:
        keys = self.target.keys
        outcome = BatchOutcome(records=len(records))
        applied_pos = {
            f: int(v)
            for f, v in zip(fields, pipe.hmget(keys.positions, fields), strict=True)
            if v is not None
        }
        pending: list[tuple[SourceRecord, str, dict[str, Any], str]] = []
        dead: list[_DeadLetter] = []
        new_pos: dict[str, int] = {}
        # Hot loop: per-partition lookups are cached by (topic, partition) tuple.
        names: dict[tuple[str, int], str] = {}
        floor: dict[str, int] = {}
        for record in records:
            tp = (record.topic, record.partition)
            field_name = names.get(tp)
            if field_name is None:
                field_name = names[tp] = position_field(*tp)
                floor[field_name] = applied_pos.get(field_name, 0)
            if record.offset < floor[field_name]:
                outcome.skipped += 1
                continue
            if record.offset >= new_pos.get(field_name, 0):
                new_pos[field_name] = record.offset + 1
            try:
                event = self.codec.decode(record.value)
            except DeserializationError as exc:
                dead.append(_DeadLetter(record, exc.reason, str(exc)))
                continue
            if event.event_type not in self.projection.event_types:
                dead.append(
                    _DeadLetter(
                        record,
                        "unexpected-type",
                        f"{self.target.processor} does not fold {event.event_type}",
                    )
                )
                continue
            entity = self.projection.key(event.event_type, event.data)
            pending.append((record, event.event_type, event.data, entity))
        entities = sorted({p[3] for p in pending})
        table_keys = [keys.table(self.projection.table, e) for e in entities]
        loaded = cast("list[bytes | None]", pipe.mget(table_keys)) if table_keys else []
        before: dict[str, State | None] = {
            e: None if raw is None else orjson.loads(raw)
            for e, raw in zip(entities, loaded, strict=True)
        }
        states = dict(before)
        effects: list[tuple[SourceRecord, SideEffect]] = []
        for record, event_type, data, entity in pending:
            try:
                previous = states[entity]
                states[entity] = new = self.projection.apply(previous, event_type, data)
                outcome.applied += 1
            except EventRejectedError as exc:
                dead.append(_DeadLetter(record, "rejected", str(exc)))
                continue
            if self._has_effects:
                effects.extend(
                    (record, e)
                    for e in effects_of(self.projection, event_type, data, previous, new)
                )
        outcome.rejected = sum(d.reason == "rejected" for d in dead)
        outcome.undecodable = len(dead) - outcome.rejected
        if dead:
            self._send_dead_letters(dead, batch_id)
        if effects:
            effects, outcome.suppressed = self._unsuppressed(pipe, effects)
            if effects:
                self._send_effects(effects)
                outcome.effects = len(effects)
        changed = {e: s for e, s in states.items() if s is not None and s != before[e]}
        delta: Counter[str] = Counter()
        for entity, state in changed.items():
            delta.update(self.projection.contribution(state))
            old = before[entity]
            if old is not None:
                delta.subtract(self.projection.contribution(old))
        pipe.multi()
        if changed:
            pipe.mset(
                {keys.table(self.projection.table, e): orjson.dumps(s) for e, s in changed.items()}
            )
        aggregate_key = keys.aggregate(self.projection.aggregate)
        for name, amount in sorted(delta.items()):
            if amount:
                pipe.hincrby(aggregate_key, name, amount)
        position_update: dict[FieldT, EncodableT] = {f: str(o) for f, o in new_pos.items()}
        if batch_id is not None:
            position_update[BATCH_ID_FIELD] = str(batch_id)
        if position_update:
            pipe.hset(keys.positions, mapping=position_update)
        for field_name, offset in new_pos.items():
            pipe.set(keys.guard(field_name), offset)
        pipe.execute()
        outcome.positions = new_pos
        return outcome

    def _unsuppressed(
        self, pipe: Pipeline, effects: list[tuple[SourceRecord, SideEffect]]
    ) -> tuple[list[tuple[SourceRecord, SideEffect]], int]:
        """The effects to send, and how many were suppressed because they happened already.

        A generation being rebuilt (``building``) knows it is replaying: the effects of records
        the live generation has already applied were produced then, and are suppressed. Those
        of records past the live generation's positions are sent, or a cutover would lose the
        effects of the records the shadow applied ahead of the live processor. Near the
        cutover both may send one (same origin headers): at least once, never lost. With no
        live generation to compare with, a rebuild suppresses them all.
        """
        layout = self.target.layout
        status = pipe.hget(layout.generations, str(self.target.generation))
        if status not in (b"building", "building"):
            return effects, 0
        raw_live = pipe.get(layout.alias)
        live = None if raw_live is None else int(cast("bytes", raw_live))
        if live is None or live == self.target.generation:
            return [], len(effects)
        fields = sorted({position_field(r.topic, r.partition) for r, _e in effects})
        live_keys = layout.generation(live)
        raw = cast("list[bytes | None]", pipe.hmget(live_keys.positions, fields))
        live_pos = {f: int(v) for f, v in zip(fields, raw, strict=True) if v is not None}
        send = [
            (r, e)
            for r, e in effects
            if r.offset >= live_pos.get(position_field(r.topic, r.partition), 0)
        ]
        return send, len(effects) - len(send)

    def _origin_headers(self, record: SourceRecord) -> list[tuple[str, str | bytes | None]]:
        """Where a dead letter or side effect comes from (consumers deduplicate on these)."""
        return [
            ("refold.origin.topic", record.topic.encode()),
            ("refold.origin.partition", str(record.partition).encode()),
            ("refold.origin.offset", str(record.offset).encode()),
            ("refold.processor", self.target.processor.encode()),
            ("refold.generation", str(self.target.generation).encode()),
        ]

    def _send_effects(self, effects: Sequence[tuple[SourceRecord, SideEffect]]) -> None:
        """Produce side effects and wait for the acknowledgements (before the commit)."""
        producer = self._dead_letter_producer()
        failures: list[str] = []

        def _delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(err.str())

        for record, effect in effects:
            producer.produce(
                effect.topic,
                orjson.dumps(effect.value),
                effect.key.encode(),
                headers=self._origin_headers(record),
                on_delivery=_delivered,
            )
        _await_acks(producer, failures, f"{len(effects)} side effects")

    def _send_dead_letters(self, dead: Iterable[_DeadLetter], batch_id: int | None) -> None:
        producer = self._dead_letter_producer()
        failures: list[str] = []

        def _delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(err.str())

        count = 0
        for letter in dead:
            record = letter.record
            headers: list[tuple[str, str | bytes | None]] = [
                ("refold.reason", letter.reason.encode()),
                ("refold.error", letter.detail.encode()[:2000]),
                *self._origin_headers(record),
            ]
            producer.produce(
                self.target.dlq_topic,
                record.value,
                record.key,
                headers=headers,
                on_delivery=_delivered,
            )
            count += 1
            logger.warning(
                "dead-lettered: %s",
                letter.detail,
                extra={
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "batch_id": batch_id,
                },
            )
        _await_acks(producer, failures, f"{count} dead letters to {self.target.dlq_topic}")
