"""The oracle: a processor's fold run the plain way, in one process, over a list of events.

Built from the same :class:`~refold.processors.fold.projection.Projection` object and the same
per-record checks (:func:`~refold.processors.fold.projection.fold_one`) as the live sink, so "live
state == oracle" tests the wiring, not two copies of the logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from refold.contracts.processors import EventId, EventTime, StateTtl
from refold.contracts.watermarks import WATERMARK, Marker
from refold.processors.fold.dedupe import SeenIds
from refold.processors.fold.eventtime import PartitionClocks, Verdict, event_time_ms, is_folded
from refold.processors.fold.expiry import Expiries, firing_order
from refold.processors.fold.lookups import LookupFold
from refold.processors.fold.projection import (
    EventRejectedError,
    Projection,
    SideEffect,
    State,
    UnstorableStateError,
    effects_of,
    encode_effects,
    fold_one,
    store_state,
)
from refold.processors.fold.rekey import KeyResolver
from refold.processors.fold.stream_clocks import TopicClocks, stream_of
from refold.processors.fold.timers import (
    TIMER_EVENT,
    GroupClocks,
    TimerQueue,
    has_timers,
    timed,
    timer_event,
)
from refold.processors.fold.windows import (
    Window,
    WindowDelta,
    WindowFold,
    combine,
    result_of,
    scaled,
    scales_of,
)

__all__ = [
    "FoldResult",
    "LookupResult",
    "TimedResult",
    "WindowOracle",
    "fold_all",
    "fold_lookups",
    "fold_timed",
    "fold_windows",
]


@dataclass(slots=True)
class FoldResult:
    """States, aggregates and rejections from folding a sequence of events in one process."""

    states: dict[str, State] = field(default_factory=dict)
    aggregate: Counter[str] = field(default_factory=Counter)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    passed: int = 0  # events of types the projection does not declare (not folded)
    duplicates: int = 0  # events passed by as duplicates (``dedupe=``)


def fold_all(
    projection: Projection,
    events: Iterable[tuple[str, Mapping[str, Any]]],
    resolver: KeyResolver | None = None,
    dedupe: EventId | None = None,
) -> FoldResult:
    """Fold events (in log order per entity) the plain way: the oracle.

    Args:
        projection: The fold.
        events: ``(event_type, event)`` pairs, in the order they were published (each
            partition's log order is a sub-sequence of it).
        resolver: For a re-keyed processor with links: resolves each event's entity as the
            live writers do (an event without the key takes its link's), and fills it in.
        dedupe: The processor's de-duplication by event id (its spec's ``dedupe``): the same
            rule as the live writer (:mod:`refold.processors.fold.dedupe`).

    Returns:
        Final states by entity key, the aggregate (zero counters dropped) and rejected
        ``(event_id-or-key, reason)`` pairs.
    """
    result = FoldResult()
    seen = SeenIds(dedupe) if dedupe is not None else None
    for position, (event_type, raw) in enumerate(events):
        event = raw
        # Every event may make a link (re-keyed), also one of a type the fold passes by.
        entity = resolver.resolve(position, raw)[0] if resolver is not None else None
        if event_type not in projection.event_types:
            result.passed += 1  # as the writer: passed by, neither folded nor dead-lettered
            continue
        if resolver is not None:
            if entity is None:
                result.rejected.append((str(raw.get("event_id")), "key-missing"))
                continue
            if raw.get(resolver.key) is None:
                event = {**raw, resolver.key: entity}
        try:
            key = str(projection.key(event_type, event))
        except Exception as exc:  # as the sink: a record without a usable key is refused
            result.rejected.append((str(event.get("event_id")), f"no key: {exc!r}"))
            continue
        if seen is not None and seen.is_duplicate(key, event):
            result.duplicates += 1
            continue
        try:
            state, _encoded, _contribution, _effects = fold_one(
                projection, result.states.get(key), event_type, event
            )
        except (EventRejectedError, UnstorableStateError) as exc:
            result.rejected.append((str(event.get("event_id", key)), str(exc)))
            continue
        result.states[key] = state
        if seen is not None:
            seen.remember(key, event)
    for state in result.states.values():
        result.aggregate.update(projection.contribution(state))
    result.aggregate = Counter({k: v for k, v in result.aggregate.items() if v != 0})
    return result


@dataclass(slots=True)
class WindowOracle:
    """Window buckets, exact distinct sets and the late records, from folding in one process.

    Attributes:
        buckets: ``(window, start, group)`` -> aggregates (``count``, ``sum:``, ``min:``...).
        distinct: ``(window, measure, start, group)`` -> the exact distinct values.
        late: ``(partition field, offset-or-index)`` of the records judged late.
        clocks: The partitions' clocks at the end.
        key_missing: Re-keyed: ``(partition field, offset)`` of the records that resolve to
            no entity (dead-lettered, no part of the clocks).
    """

    buckets: dict[tuple[str, int, str], dict[str, int]] = field(default_factory=dict)
    distinct: dict[tuple[str, str, int, str], set[str]] = field(default_factory=dict)
    late: list[tuple[str, int]] = field(default_factory=list)
    key_missing: list[tuple[str, int]] = field(default_factory=list)
    clocks: dict[str, int] = field(default_factory=dict)
    measures: tuple[str, ...] = ()
    scales: dict[str, int] = field(default_factory=dict)

    def window(self, window: Window, end: int, group: str) -> dict[str, Any]:
        """A window's result as the closer emits it (exact distinct counts)."""
        starts = window.bucket_starts(end)
        aggregates = combine(self.buckets.get((window.name, s, group), {}) for s in starts)
        distinct = {}
        for m in self.measures:
            seen = [self.distinct.get((window.name, m, s, group), set()) for s in starts]
            distinct[m] = len(set().union(*seen))
        return result_of(window, end, group, aggregates, distinct, self.scales)


def fold_windows(
    fold: WindowFold,
    event_time: EventTime,
    records: Iterable[tuple[str, int, str, Mapping[str, Any]]],
    resolver: KeyResolver | None = None,
) -> WindowOracle:
    """A window processor run the plain way: per-partition clocks, then every on-time measure.

    Args:
        fold: The window processor.
        event_time: Its event-time settings (lateness, late policy, retention).
        records: ``(partition field, offset, event_type, event)`` with each partition's records
            in log order (partitions may interleave in any way: the verdicts do not depend on
            it).
        resolver: Re-keyed (a key other than the partition key, links): each event's entity
            as the writer slots resolve it, filled in before ``measure``. Lateness is judged
            per source partition all the same, over every record that resolves.
    """
    result = WindowOracle(measures=tuple(fold.distinct), scales=scales_of(fold))
    clocks = PartitionClocks(event_time, {})
    delta = WindowDelta()
    for partition, offset, event_type, raw in records:
        event = raw
        entity = resolver.resolve(offset, raw)[0] if resolver is not None else None
        if event_type not in fold.event_types:
            continue
        if resolver is not None:
            if entity is None:  # as the owning slot: "key-missing", before the clocks
                result.key_missing.append((partition, offset))
                continue
            if raw.get(resolver.key) is None:
                event = {**raw, resolver.key: entity}
        try:
            at = event_time_ms(event, event_time.field_of(event_type))
        except EventRejectedError:
            continue
        verdict = clocks.observe(partition, at)
        if verdict is not Verdict.ON_TIME:
            result.late.append((partition, offset))
            if not is_folded(verdict, event_time):
                continue
        try:
            measures = [scaled(m, result.scales) for m in fold.measure(event_type, event)]
        except Exception:  # noqa: S112 - as the writer: the record is dead-lettered
            continue
        for measure in measures:
            delta.add(fold.windows, at, measure, event_time.retention_ms)
    for bucket, counts in delta.adds.items():
        result.buckets[bucket] = dict(counts)
    for (window, start, group, name), value in {**delta.lows, **delta.highs}.items():
        result.buckets[(window, start, group)][name] = value
    result.distinct = delta.distinct
    result.clocks = clocks.clocks
    return result


@dataclass(slots=True)
class TimedResult(FoldResult):
    """An event-time entity fold's states, aggregate and rejections, its effects and late records.

    Attributes:
        effects: The side effects, in the order they happened (timers' included).
        late: ``(partition field, offset)`` of the records judged late.
        clocks: The partitions' clocks at the end.
        expired: Entities removed by the state TTL (``state_ttl=``).
    """

    effects: list[SideEffect] = field(default_factory=list)
    late: list[tuple[str, int]] = field(default_factory=list)
    clocks: dict[str, int] = field(default_factory=dict)
    expired: int = 0


def fold_timed(
    projection: Projection,
    event_time: EventTime,
    topics: Sequence[str],
    records: Iterable[tuple[str, int, int, str, Mapping[str, Any]]],
    resolver: KeyResolver | None = None,
    stream_topics: Sequence[str] = (),
    origins: Mapping[tuple[str, int, int], str] | None = None,
    partitions: Sequence[str] | None = None,
    state_ttl: StateTtl | None = None,
) -> TimedResult:
    """An event-time entity fold with timers, run the plain way (the oracle).

    Args:
        projection: The fold (with ``due``/``on_timer`` for timers).
        event_time: Its event-time settings.
        topics: Its topics (a partition group's watermark is over all of them).
        records: ``(topic, partition, offset, event_type, event)``, each topic partition's
            records in log order; topics and partitions may interleave in any way. A
            watermark marker is ``(topic, partition, offset, WATERMARK, {"at": .., "of": ..})``
            (:mod:`refold.contracts.watermarks`).
        resolver: Re-keyed: each event's entity as the writer slots resolve it. Lateness is
            judged per source partition all the same; timers fire on the watermark over every
            partition in ``partitions``, at every record (as each writer slot does).
        stream_topics: The topics that carry markers: judged per upstream stream, as the
            writer does (:class:`~refold.processors.fold.stream_clocks.TopicClocks`).
        origins: ``(topic, partition, offset)`` -> the record's origin id (its stream), on
            those topics.
        partitions: Re-keyed with timers (or a ``state_ttl``): every ``topic/partition``
            the processor reads (one that never gets an event holds the timers back, as live).
        state_ttl: The processor's state TTL (its spec's ``state_ttl``): the same rule as the
            live writer (:mod:`refold.processors.fold.expiry`); :attr:`TimedResult.expired`
            counts the removals.

    Raises:
        ValueError: A re-keyed fold with timers and no ``partitions``.
    """
    with_timers = has_timers(projection)
    expiries = None if state_ttl is None else Expiries(state_ttl)
    if (with_timers or expiries is not None) and resolver is not None and partitions is None:
        msg = f"{projection.name} is re-keyed with timers: pass every topic/partition it reads"
        raise ValueError(msg)
    result = TimedResult()
    clocks = TopicClocks(event_time, {}, frozenset(stream_topics))
    everything = partitions if resolver is not None else None
    groups = GroupClocks(topics, event_time.lateness_ms, {}, everything)
    streams = origins or {}
    queue = TimerQueue()
    for topic, partition, offset, event_type, raw in records:
        if event_type == WATERMARK:  # as the writer: moves the clocks, never folded
            if topic in clocks.stream_topics:
                clocks.mark(topic, partition, Marker(dict(raw["at"]), int(raw["of"])))
                mark = groups.advance(topic, partition, clocks.clock(topic, partition))
                group = groups.group_of(partition)
                _fire_due(projection, result, queue, expiries, with_timers, group, mark)
            continue
        event = raw
        entity = resolver.resolve(offset, raw)[0] if resolver is not None else None
        if event_type not in projection.event_types:
            result.passed += 1  # as the writer: no part of the fold nor of event time
            continue
        if resolver is not None:
            if entity is None:  # as the owning slot: "key-missing", before the clocks
                result.rejected.append((str(raw.get("event_id")), "key-missing"))
                continue
            if raw.get(resolver.key) is None:
                event = {**raw, resolver.key: entity}
        keyed = _key_and_time(projection, event_time, event_type, event, result)
        if keyed is None:
            continue
        key, at = keyed
        field_name = f"{topic}/{partition}"
        stream = stream_of(streams.get((topic, partition, offset)))
        verdict = clocks.observe(topic, partition, stream, at)
        mark = groups.advance(topic, partition, clocks.clock(topic, partition))
        group = groups.group_of(partition)
        _fire_due(projection, result, queue, expiries, with_timers, group, mark)
        if verdict is not Verdict.ON_TIME:
            result.late.append((field_name, offset))
            if not is_folded(verdict, event_time):
                continue
        if expiries is not None and expiries.stale(group, key, at):
            _expire(result, queue, expiries, group, key)
        try:
            state, _encoded, _contribution, effects = fold_one(
                projection, result.states.get(key), event_type, event
            )
        except (EventRejectedError, UnstorableStateError) as exc:
            result.rejected.append((str(event.get("event_id")), str(exc)))
            continue
        result.states[key] = state
        result.effects.extend(effects)
        if with_timers:
            queue.set(group, key, timed(projection).due(state))
        if expiries is not None:
            expiries.applied(group, key, at)
    result.clocks = clocks.clocks
    for state in result.states.values():
        result.aggregate.update(projection.contribution(state))
    result.aggregate = Counter({k: v for k, v in result.aggregate.items() if v != 0})
    return result


def _key_and_time(
    projection: Projection,
    event_time: EventTime,
    event_type: str,
    event: Mapping[str, Any],
    result: TimedResult,
) -> tuple[str, int] | None:
    """As the writer: the key first, then the event time (``None``: refused, and noted)."""
    try:
        key = str(projection.key(event_type, event))
    except Exception as exc:  # a record without a usable key is refused
        result.rejected.append((str(event.get("event_id")), f"no key: {exc!r}"))
        return None
    try:
        at = event_time_ms(event, event_time.field_of(event_type))
    except EventRejectedError as exc:
        result.rejected.append((str(event.get("event_id")), str(exc)))
        return None
    return key, at


def _fire_due(
    projection: Projection,
    result: TimedResult,
    queue: TimerQueue,
    expiries: Expiries | None,
    with_timers: bool,
    group: int,
    mark: int | None,
) -> None:
    """As the writer: the timers and expiries of ``group`` due at ``mark``, in due order."""
    timers = queue.pop_due(group, mark) if with_timers else []
    due = expiries.pop_due(group, mark) if expiries is not None else []
    for _due, is_expiry, entity in firing_order(timers, due):
        if is_expiry:
            _expire(result, queue, cast("Expiries", expiries), group, entity)
        else:
            _fire(projection, result, queue, expiries, group, entity, cast("int", mark))


def _expire(
    result: TimedResult, queue: TimerQueue, expiries: Expiries, group: int, entity: str
) -> None:
    """The state TTL removes ``entity`` (with its own timer), as a delete."""
    expiries.forget(group, entity)
    if result.states.pop(entity, None) is not None:
        result.expired += 1
        queue.set(group, entity, None)


def _fire(
    projection: Projection,
    result: TimedResult,
    queue: TimerQueue,
    expiries: Expiries | None,
    partition: int,
    entity: str,
    watermark: int,
) -> None:
    before = result.states.get(entity)
    if before is None:
        return
    try:
        after = timed(projection).on_timer(before, watermark)
        effects = encode_effects(
            effects_of(projection, TIMER_EVENT, timer_event(watermark), before, after or {})
        )
        if after is not None:
            store_state(projection, after)
    except Exception as exc:
        result.rejected.append((entity, f"timer-error: {exc!r}"))
        return
    if after is None:
        del result.states[entity]
        if expiries is not None:
            expiries.forget(partition, entity)
    else:
        result.states[entity] = after
        queue.set(partition, entity, timed(projection).due(after))
    result.effects.extend(effects)


@dataclass(slots=True)
class LookupResult:
    """A lookup processor's aggregate, waiting events, late records and failed events.

    ``failed`` holds ``(partition field, offset, error)`` of the events the fold failed on
    (the joiner dead-letters them).
    """

    aggregate: Counter[str] = field(default_factory=Counter)
    waiting: int = 0
    late: list[tuple[str, int]] = field(default_factory=list)
    failed: list[tuple[str, int, str]] = field(default_factory=list)


def fold_lookups(
    fold: LookupFold,
    event_time: EventTime,
    records: Iterable[tuple[str, int, int, str, Mapping[str, Any]]],
    table: Mapping[str, State],
    table_watermark: int | None,
) -> LookupResult:
    """A stream-table join the plain way (the oracle).

    Every on-time event below the table's watermark, enriched with its row of the final table;
    the others wait.

    Args:
        fold: The lookup processor.
        event_time: Its event-time settings.
        records: ``(topic, partition, offset, event_type, event)``, each partition's in log
            order.
        table: The table's rows by key (its processor's final states).
        table_watermark: The table processor's watermark (``None``: nothing joins yet).
    """
    result = LookupResult()
    clocks = PartitionClocks(event_time, {})
    for topic, partition, offset, event_type, event in records:
        if event_type not in fold.event_types:
            continue
        try:
            at = event_time_ms(event, event_time.field_of(event_type))
        except EventRejectedError:
            continue
        field_name = f"{topic}/{partition}"
        verdict = clocks.observe(field_name, at)
        if verdict is not Verdict.ON_TIME:
            result.late.append((field_name, offset))
            if not is_folded(verdict, event_time):
                continue
        if table_watermark is None or at >= table_watermark:  # as the joiner: strictly below
            result.waiting += 1
            continue
        try:  # as the joiner: an event the fold fails on is a dead letter, counted nowhere
            key = fold.lookup_key(event_type, event)
            row = None if key is None else table.get(key)
            result.aggregate.update(fold.enrich(event_type, event, row, at))
        except Exception as exc:
            result.failed.append((f"{topic}/{partition}", offset, repr(exc)))
    result.aggregate = Counter({k: v for k, v in result.aggregate.items() if v})
    return result
