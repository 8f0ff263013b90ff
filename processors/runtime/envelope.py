"""Decode -> fold -> one Redis transaction: the exactly-once heart of every processor.

:meth:`FoldWriter.apply` takes the records of one Kafka partition range (or several) and writes
the changed entity states, the aggregate deltas and the new source positions in ONE MULTI/EXEC,
guarded by WATCH on the guard keys of its partitions (:mod:`.watched_commit`, the commit every
engine writes through). Records below a partition's applied position are skipped, so a
re-executed Spark batch, a crash between sink and checkpoint or an overlapping replay range
changes nothing. A concurrent writer (a zombie task) makes EXEC fail and the batch is re-planned.

What the records become is the fold's kind of state (entities, windows, lookups, or a kind
added as a module: :mod:`refold.processors.runtime.kinds`); the transaction around it is the same
for all.

Entities are not watched (it cost ~5 us per record): an entity must live on one partition, which
the producer SDK guarantees by keying every event with its aggregate id.

Records that do not decode or that the fold rejects go to the dead-letter topic, with the reason and
origin in headers. A batch's outputs (dead letters, the late side output, side effects) are
committed in a Kafka transaction before its Redis transaction, with markers that make a re-folded
batch skip what an earlier run committed (:mod:`refold.processors.runtime.output_transactions`): a
read_committed consumer sees each output once, and nothing is lost.

Lifecycle: a FoldWriter is picklable before first use and opens its Redis client and dead-letter
producer lazily, in the process that calls :meth:`apply` (a Spark executor's Python worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import redis
from redis.client import Pipeline

from refold.contracts.codec import EventCodec
from refold.contracts.layout import (
    parse_position_field,
    position_field,
)
from refold.contracts.store.connect import redis_client
from refold.contracts.store.outage import RedisOutage
from refold.contracts.store.positions import parse_fields
from refold.contracts.store.stats import count_outcome
from refold.processors.errors import (
    REDIS_UNAVAILABLE,
    StateStoreUnavailableError,
)
from refold.processors.fold.projection import (
    Projection,
)
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import Link
from refold.processors.fold.timers import (
    has_timers,
)
from refold.processors.runtime.applied_positions import HoleError, check_holes, write_positions
from refold.processors.runtime.batch_letters import queue_letters
from refold.processors.runtime.dead_letter_index import building_against, record_sent
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget
from refold.processors.runtime.intake import Intake
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages
from refold.processors.runtime.kinds import BatchKind, kind_of
from refold.processors.runtime.lateness import (
    ForeignTime,
    StreamMark,
    judge_lateness,
)
from refold.processors.runtime.origin_marks import drop_resent
from refold.processors.runtime.output_transactions import Outbox, OutputTransactions, marker_group
from refold.processors.runtime.shards import SHARDABLE_KINDS, split_by_shard
from refold.processors.runtime.watched_commit import commit_watched

__all__ = ["BatchOutcome", "FoldTarget", "FoldWriter"]  # the first two re-exported

logger = logging.getLogger(__name__)


class FoldWriter:
    """Applies record batches of one processor generation to Redis, exactly once in effect.

    Args:
        target: Where to write.
        projection: The pure fold.
        codec: Contract codec; default the shipped schemas, newest version as reader.
    """

    def __init__(
        self,
        target: FoldTarget,
        projection: Projection,
        codec: EventCodec | None = None,
        slot: int | None = None,
    ) -> None:
        if (slot is None) != (target.slots == 0) or (slot is not None and slot >= target.slots):
            msg = f"slot {slot} does not fit a target with {target.slots} slots"
            raise ValueError(msg)
        self.target = target
        self.projection = projection
        self.codec = codec or EventCodec()
        self.slot = slot
        self._redis: redis.Redis | None = None
        self._outputs: OutputTransactions | None = None
        # Timers and the state TTL's expiries fire on the same watermarks (lateness.py).
        self._timers = target.event_time is not None and (
            has_timers(projection) or target.state_ttl is not None
        )
        # The fold's kind of state (entities, windows, lookups...) stages each transaction's
        # changes (refold.processors.runtime.kinds). Only entities are keyed: the records of
        # the other kinds go to no entity.
        kind_name, make_kind = kind_of(projection)
        self._kind: BatchKind = make_kind(self)
        keyless = not self._kind.keyed
        if target.shards and (target.slots or kind_name not in SHARDABLE_KINDS):
            # Lookups and added kinds keep state several partitions share, and re-keyed slots
            # share links: neither is split by partition id.
            msg = f"{target.processor}: only a co-partitioned entity or window fold is sharded"
            raise ValueError(msg)
        self._intake = Intake(target, projection, self.codec, slot, keyed=not keyless)
        # A sharded generation: one writer per shard (partition id), sharing this one's Redis
        # client and Kafka transactions, so that each transaction stays in its shard's slot.
        self._shard_writers: dict[int, FoldWriter] = {}

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (created on first use)."""
        if self._redis is None:
            self._redis = redis_client(self.target.redis_url)
        return self._redis

    @property
    def outputs(self) -> OutputTransactions:
        """The Kafka transactions of this writer's outputs (created on first use)."""
        if self._outputs is None:
            target = self.target
            group = marker_group(
                target.key_prefix,
                target.processor,
                target.generation,
                self.slot,
                target.created_at,
            )
            writers = target.keys.writers
            self._outputs = OutputTransactions(
                dict(target.kafka),
                group,
                lambda writer: self.redis.sadd(writers, writer),
                floor={(t, p): o for t, p, o in target.output_floor},
                exempt=frozenset({target.dlq_topic, target.late_topic}),
            )
        return self._outputs

    def begin_task(self) -> None:
        """Forget what the last task learned (links, scanned partitions): a new task begins.

        Links learned in memory are facts of the log, but a task only needs those of the
        records it reads; everything before them is in Redis (:meth:`Intake.begin_task`).
        """
        self._intake.begin_task()
        for writer in self._shard_writers.values():
            writer.begin_task()

    @property
    def _sharded(self) -> bool:
        return bool(self.target.shards) and self.target.shard is None

    def _shard_writer(self, shard: int) -> FoldWriter:
        """The writer of one shard of a sharded generation (made on first use)."""
        writer = self._shard_writers.get(shard)
        if writer is None:
            target = dataclasses.replace(self.target, shard=shard)
            writer = FoldWriter(target, self.projection, self.codec)
            writer._redis = self.redis
            writer._outputs = self.outputs
            self._shard_writers[shard] = writer
        return writer

    def _apply_sharded(
        self,
        records: Sequence[SourceRecord],
        batch_id: int | None,
        covered: Mapping[str, tuple[int, int]],
    ) -> BatchOutcome:
        """Apply each partition id's records in its shard's own transaction."""
        outcome = BatchOutcome()
        for shard, part, ranges in split_by_shard(records, covered):
            outcome.merge(self._shard_writer(shard).apply(part, batch_id, ranges))
        return outcome

    def connect(self) -> None:
        """Connect to Redis now rather than at first use (overlapping the task's read)."""
        # Only a head start: apply() waits for an unreachable Redis.
        with contextlib.suppress(*REDIS_UNAVAILABLE):
            self.redis.ping()

    def apply(
        self,
        records: Sequence[SourceRecord],
        batch_id: int | None = None,
        covered: Mapping[str, tuple[int, int]] | None = None,
    ) -> BatchOutcome:
        """Fold ``records`` into the generation and record their positions, atomically.

        The applied positions in Redis are the truth (DESIGN.md decision 9): when a partition's
        records start above its applied position (Redis lost writes: a failover to a lagging
        replica, a restore, a lost fsync), the missing range is read from Kafka and folded
        first. When Redis is unreachable, the call waits (with backoff) and carries on.

        Args:
            records: Records of one or more partitions, each partition's in offset order.
            batch_id: Spark batch id, stored with the positions for diagnosis.
            covered: Per position field, a range ``[start, end)`` that the caller read in
                full: ``records`` holds every record of it not applied yet. The position then
                moves to ``end`` even when its last offsets held no record (transaction
                markers, compaction).

        Returns:
            Counts and the new positions (``topic/partition`` -> next offset).

        Raises:
            SinkConflictError: The positions kept changing under us.
            DeadLetterError: The dead-letter topic did not acknowledge a record.
            StateStoreUnavailableError: Redis stayed unreachable for too long.
        """
        if self._sharded:
            return self._apply_sharded(records, batch_id, covered or {})
        outcome = BatchOutcome()
        outage: RedisOutage | None = None
        while True:
            try:
                outcome.merge(self._apply_guarded(records, batch_id, covered or {}))
                if outage is not None:
                    outage.over()
                return outcome
            except HoleError as hole:
                outcome.merge(self._refill(hole.ranges, batch_id))
            except REDIS_UNAVAILABLE as exc:
                outage = outage or RedisOutage(
                    f"the processor {self.target.processor}",
                    self.redis,
                    self._unavailable,
                    log_extra={"generation": self.target.generation},
                )
                outage.wait(exc)

    def _unavailable(self, waited: float, exc: Exception) -> StateStoreUnavailableError:
        return StateStoreUnavailableError(
            f"{self.target.processor} g{self.target.generation}: Redis unreachable for "
            f"{waited:.0f}s ({exc}); the batch was not applied and nothing is lost. "
            "Operator action: bring Redis back; the processor applies the batch on restart."
        )

    def _apply_guarded(
        self,
        records: Sequence[SourceRecord],
        batch_id: int | None,
        covered: Mapping[str, tuple[int, int]],
    ) -> BatchOutcome:
        keys = self.target.keys
        fields = sorted({position_field(r.topic, r.partition) for r in records} | set(covered))
        if not fields:
            return BatchOutcome()
        guards = (
            [keys.guard(f) for f in fields] if self.slot is None else [keys.slot_guard(self.slot)]
        )
        return commit_watched(
            self.redis,
            guards,
            lambda pipe: self._apply_once(pipe, records, fields, batch_id, covered),
            f"{self.target.processor} g{self.target.generation}",
            {"batch_id": batch_id, "generation": self.target.generation},
        )

    def _refill(self, ranges: dict[str, tuple[int, int]], batch_id: int | None) -> BatchOutcome:
        """Read and fold the ranges Redis lost, chunk by chunk, before the records that follow."""
        spans = []
        for field_name, (start, end) in sorted(ranges.items()):
            topic, partition = cast("tuple[str, int]", parse_position_field(field_name))
            spans.append((topic, partition, start, end))
            logger.warning(
                "%s g%d: Redis has applied %s only up to %d but records continue at %d "
                "(Redis lost writes: failover, restore or lost fsync); folding %d records again",
                self.target.processor,
                self.target.generation,
                field_name,
                start,
                end,
                end - start,
                extra={"topic": topic, "partition": partition, "batch_id": batch_id},
            )
        options = SourceOptions(
            kafka=self.target.kafka,
            topics=tuple(sorted({s[0] for s in spans})),
            archive_root=self.target.archive_root,
        )
        outcome = BatchOutcome()
        for chunk in read_messages(options, tuple(spans), slot="refill"):
            records = [SourceRecord.of_message(m) for m in chunk]
            outcome.merge(self._apply_guarded(records, batch_id, {}))
        # Whatever the ranges' last offsets held, they are now applied up to their ends.
        outcome.merge(self._apply_guarded([], batch_id, ranges))
        return outcome

    def _apply_once(
        self,
        pipe: Pipeline,
        records: Sequence[SourceRecord],
        fields: list[str],
        batch_id: int | None,
        covered: Mapping[str, tuple[int, int]],
    ) -> BatchOutcome:
        outcome = BatchOutcome(records=len(records))
        positions_key = self.target.positions(pipe).writer_key(self.slot)
        applied_pos = parse_fields(fields, pipe.hmget(positions_key, fields))
        check_holes(records, applied_pos, covered)
        outbox = Outbox()
        pending: list[tuple[SourceRecord, str, dict[str, Any], str]] = []
        dead: list[DeadLetter] = []
        new_pos: dict[str, int] = {}
        links: list[tuple[str, str, Link]] = []
        foreign: list[ForeignTime] = []  # re-keyed: the other slots' records, for the clocks
        markers: list[StreamMark] = []  # watermark markers of derived topics, for the clocks
        if self.slot is None:
            self._intake.take(records, applied_pos, pending, dead, new_pos, outcome, markers)
        else:
            self._intake.route(
                pipe, records, applied_pos, pending, dead, new_pos, links, outcome, foreign, markers
            )
        for field_name, (_start, end) in covered.items():
            reached = max(new_pos.get(field_name, 0), applied_pos.get(field_name, 0))
            if end > reached:
                new_pos[field_name] = end
        marks: dict[str, str] = {}
        if any(p[0].origin is not None for p in pending):
            pending, marks = drop_resent(pipe, self.target, self.slot, pending, outcome)
        clocks: dict[str, int] = {}
        late_out: list[DeadLetter] = []
        watermarks: list[int | None] = []
        if self.target.event_time is not None and (pending or foreign or markers):
            judged, refused, late_out, late = judge_lateness(
                pipe, self.target, self.slot, pending, foreign, markers, self._timers
            )
            pending, clocks, watermarks = judged.kept, judged.clocks, judged.marks
            dead += refused
            outcome.late += late
        staged = self._kind.stage(pipe, pending, watermarks, dead, outcome)
        letters = queue_letters(self.redis, self.target, dead, late_out, batch_id, outcome, outbox)
        staged.send_effects(outbox)
        self._commit_outputs(outbox, new_pos)
        record_sent(self.redis, self.target.layout, letters)  # in Kafka now: sent for good
        pipe.multi()
        staged.write(pipe)
        write_positions(
            pipe,
            self.target,
            self.slot,
            positions_key,
            new_pos,
            clocks,
            marks,
            links,
            batch_id,
            letters.entries,
        )
        self._count(pipe, outcome)
        pipe.execute()
        outcome.positions = new_pos
        return outcome

    def _count(self, pipe: Pipeline, outcome: BatchOutcome) -> None:
        """The outcome's counts, in the transaction (exact stats: contracts/store/stats.py)."""
        count_outcome(
            pipe,
            self.target.keys.stats,
            events=outcome.applied,
            duplicates=outcome.duplicates,
            effects=outcome.effects,
            expired=outcome.expired,
            dead_letters=outcome.dead_letters,
        )

    def building_against(
        self, partitions: Iterable[tuple[str, int]]
    ) -> tuple[int | None, dict[str, int]] | None:
        """What a building generation compares with (:func:`building_against`).

        Read with the plain client, not the transaction's WATCHing connection: these keys are
        in other hash slots (the registry's, the live generation's), and none of them is
        watched (a flip during the batch changes nothing this batch writes).
        """
        return building_against(self.redis, self.target.layout, self.target.generation, partitions)

    def _commit_outputs(self, outbox: Outbox, new_pos: Mapping[str, int]) -> None:
        """Commit the batch's outputs in Kafka (before Redis: see the module's docstring)."""
        if not outbox:
            return
        ends: dict[tuple[str, int], int] = {}
        for output in outbox.outputs:
            tp = output.source
            reached = new_pos.get(position_field(*tp), 0)
            ends[tp] = max(ends.get(tp, 0), reached, output.offset + 1)
        markers = outbox.markers(self.outputs.partitions, self.target.streams)
        self.outputs.send(outbox, ends, markers)
