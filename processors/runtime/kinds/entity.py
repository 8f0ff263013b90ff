"""Entity folds: one state per entity, its counters, timers, expiry, de-duplication, effects.

For one transaction: load the states of the entities the records touch (and of the entities
whose timers are due), fold each record in log order, firing the due timers of its partition
group first (and the expiries of a ``state_ttl``: :mod:`refold.processors.fold.expiry`), skip an
event whose id the entity has applied already (``dedupe``), and keep what changed: the states
(JSON), the aggregate's increments (``contribution(new) - contribution(old)``), the timers,
expiries and remembered ids, all written in the MULTI. Side effects are sent in the
batch's Kafka transaction, except those a building generation knows the live one sent already.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import orjson
from redis.client import Pipeline

from refold.contracts.layout import position_field
from refold.contracts.origin import ORIGIN_ID, origin_headers, origin_id
from refold.contracts.store.connect import pipelined_mget, pipelined_mset
from refold.contracts.watermarks import WATERMARK
from refold.processors.fold.dedupe import SeenIds
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.expiry import Expiries, firing_order
from refold.processors.fold.projection import (
    EventRejectedError,
    FoldError,
    InvalidOutputError,
    Projection,
    SideEffect,
    State,
    UnstorableStateError,
    effects_of,
    encode_effects,
    fits_int64,
    fold_one,
    store_state,
)
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.timers import (
    TIMER_EVENT,
    TimerQueue,
    has_timers,
    timed,
    timer_event,
)
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.expiries import load_expiries, write_expiries
from refold.processors.runtime.fold_target import BatchOutcome, PendingRecord
from refold.processors.runtime.kinds.base import FoldContext
from refold.processors.runtime.output_transactions import Outbox
from refold.processors.runtime.window_writes import timers_key, write_timers

__all__ = ["EntityKind"]

logger = logging.getLogger(__name__)


class _Folded:
    """One transaction's folded entities: states, their JSON and contributions, and sources."""

    def __init__(self, before: dict[str, State | None]) -> None:
        self.before = before
        self.states = dict(before)
        self.encoded: dict[str, bytes | None] = {}  # None: the entity is deleted
        self.contributions: dict[str, Mapping[str, int]] = {}
        self.sources: dict[str, list[SourceRecord]] = {}
        self.effects: list[tuple[SourceRecord, SideEffect]] = []

    def record(
        self,
        record: SourceRecord,
        entity: str,
        state: State | None,
        encoded: bytes | None,
        contribution: Mapping[str, int],
    ) -> None:
        self.states[entity] = state
        self.encoded[entity] = encoded
        self.contributions[entity] = contribution
        self.sources.setdefault(entity, []).append(record)

    def delta(self, projection: Projection) -> Counter[str]:
        """``contribution(new) - contribution(old)`` summed over the changed entities."""
        delta: Counter[str] = Counter()
        for entity in self.contributions:
            delta.update(self.change(entity, projection))
        return delta

    def change(self, entity: str, projection: Projection) -> Counter[str]:
        """What one entity's change adds to each counter (zeros dropped)."""
        change: Counter[str] = Counter(self.contributions[entity])
        old = self.before[entity]
        if old is not None:
            change.subtract(projection.contribution(old))
        return Counter({n: v for n, v in change.items() if v})

    def undo(self, entity: str) -> list[SourceRecord]:
        """Forget an entity's changes; returns the records that made them."""
        self.states[entity] = self.before[entity]
        del self.encoded[entity], self.contributions[entity]
        undone = self.sources.pop(entity)
        gone = {id(r) for r in undone}
        self.effects = [(r, e) for r, e in self.effects if id(r) not in gone]
        return undone


@dataclass(slots=True)
class _Fired:
    """What firing timers and expiries changes in one transaction."""

    folded: _Folded
    dead: list[DeadLetter]
    outcome: BatchOutcome
    queue: TimerQueue
    expiries: Expiries | None
    seen: SeenIds | None


class _StagedEntities:
    """The folded entities of one transaction, with what goes out and what is written."""

    def __init__(
        self,
        kind: EntityKind,
        pipe: Pipeline,
        folded: _Folded,
        delta: Counter[str],
        queue: TimerQueue | None,
        seen: SeenIds | None,
        outcome: BatchOutcome,
        expiries: Expiries | None = None,
    ) -> None:
        self.kind = kind
        self.pipe = pipe
        self.folded = folded
        self.delta = delta
        self.queue = queue
        self.expiries = expiries
        self.seen = seen
        self.outcome = outcome

    def send_effects(self, outbox: Outbox) -> None:
        if not self.folded.effects:
            return
        to_send, self.outcome.suppressed = self.kind.unsuppressed(self.pipe, self.folded.effects)
        if to_send:
            self.kind.queue_effects(to_send, outbox)
            self.outcome.effects = len(to_send)

    def write(self, pipe: Pipeline) -> None:
        keys = self.kind.context.target.keys
        table = self.kind.context.projection.table
        encoded = self.folded.encoded
        stored = {e: b for e, b in encoded.items() if b is not None}
        if stored:
            pipelined_mset(pipe, {keys.table(table, e): b for e, b in stored.items()})
        gone = [keys.table(table, e) for e, b in encoded.items() if b is None]
        if gone:
            pipe.delete(*gone)
        if self.queue is not None:
            write_timers(pipe, keys, self.queue, self.kind.context.slot)
        if self.expiries is not None:
            write_expiries(pipe, keys, self.expiries, self.kind.context.slot)
        if self.seen is not None and self.seen.changed:
            pipelined_mset(
                pipe, {keys.seen_ids(table, e): ids for e, ids in self.seen.encoded().items()}
            )
        if self.seen is not None and self.seen.forgotten:
            pipe.delete(*(keys.seen_ids(table, e) for e in self.seen.forgotten))
        aggregate_key = keys.aggregate(self.kind.context.projection.aggregate)
        for name, amount in sorted(self.delta.items()):
            if amount:
                pipe.hincrby(aggregate_key, name, amount)


class EntityKind:
    """The kind of every fold with entities (the default kind)."""

    keyed = True

    def __init__(self, context: FoldContext) -> None:
        self.context = context
        self.projection = context.projection
        self.timers = context.target.event_time is not None and has_timers(context.projection)
        event_time = context.target.event_time
        self.ttl = None if event_time is None else context.target.state_ttl
        self.has_effects = getattr(context.projection, "effects", None) is not None

    def stage(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        watermarks: Sequence[int | None],
        dead: list[DeadLetter],
        outcome: BatchOutcome,
    ) -> _StagedEntities:
        """Fold the records into their entities' states (and fire due timers), in memory."""
        keys = self.context.target.keys
        table = self.projection.table
        queue = self._load_timers(pipe, pending, watermarks) if self.timers else None
        expiries = self._load_expiries(pipe, pending, watermarks)
        folds = {p[3] for p in pending if p[1] != WATERMARK}  # not the ticks of markers
        due = (queue.entities() if queue else set()) | (expiries.entities() if expiries else set())
        entities = sorted(folds | due)
        table_keys = [keys.table(table, e) for e in entities]
        loaded = cast("list[bytes | None]", pipelined_mget(pipe, table_keys)) if table_keys else []
        before: dict[str, State | None] = {
            e: None if raw is None else orjson.loads(raw)
            for e, raw in zip(entities, loaded, strict=True)
        }
        folded = _Folded(before)
        seen = self._load_seen(pipe, entities)
        fired = _Fired(folded, dead, outcome, queue or TimerQueue(), expiries, seen)
        for index, (record, event_type, data, entity) in enumerate(pending):
            if queue is not None or expiries is not None:
                self._fire_due(fired, record, watermarks[index])
            if event_type == WATERMARK:  # a marker's tick: timers only (lateness.py)
                continue
            at = self._stale_check(fired, record, event_type, data, entity)
            if seen is not None and seen.is_duplicate(entity, data):
                outcome.duplicates += 1
                continue
            try:
                new, encoded, contribution, effects = fold_one(
                    self.projection, folded.states[entity], event_type, data
                )
            except EventRejectedError as exc:
                reason = (
                    "fold-error"
                    if isinstance(exc, FoldError)
                    else "invalid-output"
                    if isinstance(exc, InvalidOutputError)
                    else "rejected"
                )
                dead.append(DeadLetter(record, reason, str(exc)))
                continue
            except UnstorableStateError as exc:
                dead.append(DeadLetter(record, exc.reason, str(exc)))
                continue
            folded.record(record, entity, new, encoded, contribution)
            if seen is not None:
                seen.remember(entity, data)
            outcome.applied += 1
            if self.has_effects:
                folded.effects.extend((record, effect) for effect in effects)
            if queue is not None:
                queue.set(self._group(record), entity, self._due(new))
            if expiries is not None and at is not None:
                expiries.applied(self._group(record), entity, at)
        delta = self._delta(pipe, folded, dead, outcome)
        return _StagedEntities(self, pipe, folded, delta, queue, seen, outcome, expiries)

    def _load_seen(self, pipe: Pipeline, entities: Sequence[str]) -> SeenIds | None:
        """The latest event ids of ``entities``, when the processor de-duplicates (pre-MULTI)."""
        dedupe = self.context.target.dedupe
        if dedupe is None:
            return None
        table = self.projection.table
        keys = [self.context.target.keys.seen_ids(table, e) for e in entities]
        raw = cast("list[bytes | None]", pipelined_mget(pipe, keys)) if keys else []
        return SeenIds.load(dedupe, dict(zip(entities, raw, strict=True)))

    def _group(self, record: SourceRecord) -> int:
        """The record's timer group: its partition id, or re-keyed the slot's one group (0).

        A re-keyed slot's entities take events from every partition, so their timers fire on
        the slot's watermark over all of them (:class:`~refold.processors.fold.timers.GroupClocks`).
        """
        return record.partition if self.context.slot is None else 0

    def _due(self, state: State | None) -> int | None:
        """The entity's timer (user code: a failure means no timer, and is logged)."""
        if state is None:
            return None
        try:
            return timed(self.projection).due(state)
        except Exception:  # user code: one entity's failure must not stop the stream
            logger.exception(
                "%s: due() raised; the entity has no timer", self.context.target.processor
            )
            return None

    def _load_timers(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        marks: Sequence[int | None],
    ) -> TimerQueue:
        """The stored timers that may fire in this transaction (up to each group's last mark)."""
        last: dict[int, int] = {}
        for (record, *_rest), mark in zip(pending, marks, strict=True):
            if mark is not None:
                group = self._group(record)
                last[group] = max(mark, last.get(group, mark))
        timers = TimerQueue()
        keys, slot = self.context.target.keys, self.context.slot
        for pid, mark in sorted(last.items()):
            raw = cast(
                "list[tuple[bytes, float]]",
                pipe.zrangebyscore(timers_key(keys, pid, slot), "-inf", mark, withscores=True),
            )
            timers.load(pid, [(e.decode(), int(d)) for e, d in raw])
        return timers

    def _load_expiries(
        self, pipe: Pipeline, pending: Sequence[PendingRecord], marks: Sequence[int | None]
    ) -> Expiries | None:
        """The stored expiries that may fire, and those of the entities folded (``state_ttl``)."""
        if self.ttl is None:
            return None
        last: dict[int, int] = {}
        touched: dict[int, set[str]] = {}
        for (record, event_type, _data, entity), mark in zip(pending, marks, strict=True):
            group = self._group(record)
            if mark is not None:
                last[group] = max(mark, last.get(group, mark))
            if event_type != WATERMARK:
                touched.setdefault(group, set()).add(entity)
        target = self.context.target
        chosen = {g: sorted(names) for g, names in touched.items()}
        return load_expiries(pipe, target.keys, self.context.slot, self.ttl, last, chosen)

    def _stale_check(
        self,
        fired: _Fired,
        record: SourceRecord,
        event_type: str,
        data: Mapping[str, object],
        entity: str,
    ) -> int | None:
        """A record at or past its entity's expiry finds the entity expired first.

        Returns:
            The record's event time (``None``: no state TTL).
        """
        event_time = self.context.target.event_time
        if fired.expiries is None or event_time is None:
            return None
        at = event_time_ms(data, event_time.field_of(event_type))  # judged already: it has one
        group = self._group(record)
        if fired.expiries.stale(group, entity, at):
            self._expire(fired, group, entity, record)
        return at

    def _expire(self, fired: _Fired, group: int, entity: str, record: SourceRecord) -> None:
        """The state TTL removes ``entity``: a delete (its state, contribution, own timer)."""
        cast("Expiries", fired.expiries).forget(group, entity)
        if fired.folded.states.get(entity) is None:
            return
        fired.folded.record(record, entity, None, None, {})
        fired.outcome.expired += 1
        if self.timers:
            fired.queue.set(group, entity, None)
        if fired.seen is not None:
            fired.seen.forget(entity)

    def _fire_due(self, fired: _Fired, record: SourceRecord, mark: int | None) -> None:
        """Fire the timers and expiries of the record's group due at its watermark, in order."""
        group = self._group(record)
        timers = fired.queue.pop_due(group, mark) if self.timers else []
        expiries = fired.expiries.pop_due(group, mark) if fired.expiries is not None else []
        for due, is_expiry, entity in firing_order(timers, expiries):
            if is_expiry:
                self._expire(fired, group, entity, record)
            else:
                self._fire_timer(fired, record, group, due, entity, cast("int", mark))

    def _fire_timer(
        self,
        fired: _Fired,
        record: SourceRecord,
        group: int,
        due: int,
        entity: str,
        watermark: int,
    ) -> None:
        """One entity's own timer, due at or below ``watermark``."""
        folded, queue = fired.folded, fired.queue
        before = folded.states.get(entity)
        if before is None:
            return
        try:
            after = timed(self.projection).on_timer(before, watermark)
            event = timer_event(watermark)
            effects = encode_effects(
                effects_of(self.projection, TIMER_EVENT, event, before, after or {})
            )
            encoded: bytes | None = None
            contribution: Mapping[str, int] = {}
            if after is not None:
                encoded, contribution = store_state(self.projection, after)
        except Exception as exc:  # user code: the entity keeps its state, without timer
            detail = (
                f"on_timer of {entity!r} (due {due}, watermark {watermark}) raised "
                f"{exc!r}; the entity keeps its state and has no timer until it changes"
            )
            fired.dead.append(DeadLetter(record, "timer-error", detail, timer=True))
            return
        folded.record(record, entity, after, encoded, contribution)
        if self.has_effects:
            folded.effects.extend((record, effect) for effect in effects)
        queue.set(group, entity, self._due(after))
        if after is None and fired.expiries is not None:
            fired.expiries.forget(group, entity)

    def _delta(
        self, pipe: Pipeline, folded: _Folded, dead: list[DeadLetter], outcome: BatchOutcome
    ) -> Counter[str]:
        """The aggregate's increments; records that would overflow a counter are dead letters.

        A counter is shared by every partition, so whether it overflows depends on what the
        other partitions added before: this one check is not batch-independent (the per-state
        checks are). It only triggers near 2**63.
        """
        delta = folded.delta(self.projection)
        if not delta:
            return delta
        aggregate_key = self.context.target.keys.aggregate(self.projection.aggregate)
        names = sorted(delta)
        raw = cast("list[bytes | None]", pipe.hmget(aggregate_key, names))
        current = {n: int(v) for n, v in zip(names, raw, strict=True) if v is not None}
        if all(fits_int64(current.get(n, 0) + delta[n]) for n in names):
            return delta
        # Slow path, near 2**63 only: take the entities in the order their records came and
        # refuse those that would push a counter out of range.
        running = dict(current)
        for entity in list(folded.contributions):
            change = folded.change(entity, self.projection)
            if all(fits_int64(running.get(n, 0) + v) for n, v in change.items()):
                for name, value in change.items():
                    running[name] = running.get(name, 0) + value
                continue
            detail = f"a counter ({', '.join(sorted(change))}) would leave signed 64 bits"
            for record in folded.undo(entity):
                dead.append(DeadLetter(record, "overflow", detail))
                outcome.applied -= 1
        return folded.delta(self.projection)

    def unsuppressed(
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
        building = self.context.building_against({r[:2] for r, _e in effects})
        if building is None:
            return effects, 0
        live, live_pos = building
        if live is None:
            return [], len(effects)
        send = [
            (r, e)
            for r, e in effects
            if r.offset >= live_pos.get(position_field(r.topic, r.partition), 0)
        ]
        return send, len(effects) - len(send)

    def queue_effects(
        self, effects: Sequence[tuple[SourceRecord, SideEffect]], outbox: Outbox
    ) -> None:
        """Queue side effects in ``outbox``.

        Each with its origin id, each stream (source partition) in origin order (offset, then
        the record's own order): a consumer deduplicates per stream on it
        (:mod:`refold.contracts.origin`). The streams are merged by their records' timestamps, so a
        consumer on event time sees a batch's outputs roughly as they happened, not one source
        partition's whole span after another's.
        """
        target = self.context.target
        timed_topics = dict(target.marked)
        streams: dict[tuple[str, int], list[tuple[int, SourceRecord, SideEffect, str]]] = {}
        for record, effect in sorted(effects, key=lambda e: e[0][:3]):  # stable
            stream = streams.setdefault((record.topic, record.partition), [])
            index = stream[-1][0] + 1 if stream and stream[-1][1].offset == record.offset else 0
            oid = origin_id(target.processor, *record[:3], index, self.context.slot)
            stream.append((index, record, effect, oid))
        for _index, record, effect, oid in heapq.merge(
            *streams.values(), key=lambda e: e[1].timestamp
        ):
            if effect.topic in timed_topics:  # for the watermark markers
                _mark(outbox, effect, timed_topics[effect.topic], oid)
            outbox.add(
                record[:3],
                effect.topic,
                effect.payload if effect.payload is not None else orjson.dumps(effect.value),
                effect.key.encode(),
                [
                    *origin_headers(*record[:3], target.processor, target.generation),
                    (ORIGIN_ID, oid.encode()),
                ],
            )


def _mark(outbox: Outbox, effect: SideEffect, field: str, oid: str) -> None:
    """An output on a stream with markers: its event time, for its stream (the origin id's)."""
    try:
        at = event_time_ms(effect.value, field)
    except EventRejectedError:
        return  # the consumer dead-letters it ("no-event-time"): no part of a clock
    outbox.mark(effect.topic, oid.rpartition("@")[0], at)
