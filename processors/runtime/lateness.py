"""Lateness in the fold transaction: each record judged against its partition's stored clock.

Pure rule in :mod:`refold.processors.fold.eventtime`; this module reads the clocks under the
transaction's guard, judges the chunk's records in log order and queues the clocks that moved
(inside the MULTI, with the positions).

**Who owns a clock.** Co-partitioned, a partition's task owns its clock: the field
``<topic>/<partition>`` of the generation's clocks hash, moved under the partition's guard.

Re-keyed, every writer slot reads every record of its partitions' ranges in log order (it
folds only its own entities' records). So every slot judges lateness against the *whole*
partition: it observes, besides its own records, those that other slots fold (their event time
only; :meth:`~refold.processors.runtime.intake.Intake.route` hands them over as
:class:`ForeignTime`). Each slot keeps its own copy of each partition's clock, the field
``s<slot>|<topic>/<partition>``, moved with its own positions under its own guard. One shared
field could not work: a slot ahead of another would write a clock "from the future" of the
slower slot's records, and they would be judged late against events that come after them; nor
could it be written under one slot's guard while another slot writes it. Because every slot's
clock at an offset is the largest event time of the same records, the slots' copies agree
offset by offset, so the verdicts are those of a co-partitioned processor, whatever the slots'
batch sizes and progress. The generation's own field ``<topic>/<partition>`` is the minimum
over the slots' copies (the clock at the generation's position, the slots' minimum), written
atomically in each slot's transaction as the positions are: the watermark, window closing and
every reader read a re-keyed generation as any other.

**Derived topics.** On a topic that carries watermark markers (another processor's output
stream, ``FoldTarget.stream_topics``), lateness is judged per upstream stream
(:class:`~refold.processors.fold.stream_clocks.StreamClocks`, chosen per topic by
:class:`~refold.processors.fold.stream_clocks.TopicClocks`): markers (:class:`StreamMark`, from
the intake, never decoded) move the streams' clocks in log order between the records. The
hash is read whole then: a partition's stream fields (``<topic>/<p>|<stream>``, re-keyed
``s<slot>|<topic>/<p>|<stream>``) are not known in advance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from refold.contracts.layout import GenerationKeys, parse_position_field, position_field
from refold.contracts.processors import EventTime
from refold.contracts.store.connect import pipelined_eval
from refold.contracts.watermarks import WATERMARK, Marker
from refold.processors.fold.eventtime import Verdict, event_time_ms, is_folded
from refold.processors.fold.projection import EventRejectedError
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.stream_clocks import TopicClocks, stream_of
from refold.processors.fold.timers import GroupClocks
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import FoldTarget, PendingRecord

__all__ = [
    "ForeignTime",
    "Judged",
    "StreamMark",
    "judge_lateness",
    "slot_clock_field",
    "write_clocks",
]

# KEYS[1]: the clocks hash; ARGV[1]: the number of slots, ARGV[2..]: partition fields. Each
# field becomes the minimum of the slots' copies ``s<i>|<field>``; left alone while a slot has
# none (it has observed nothing there yet).
_MIN_CLOCKS = """
local slots = tonumber(ARGV[1])
for a = 2, #ARGV do
  local f, low = ARGV[a], nil
  for s = 0, slots - 1 do
    local v = redis.call('HGET', KEYS[1], 's' .. s .. '|' .. f)
    if not v then low = nil break end
    v = tonumber(v)
    if low == nil or v < low then low = v end
  end
  if low ~= nil then redis.call('HSET', KEYS[1], f, low) end
end
return 0
"""


def slot_clock_field(slot: int | None, field: str) -> str:
    """The clocks-hash field of partition ``field``'s clock as a writer (slot) keeps it."""
    return field if slot is None else f"s{slot}|{field}"


@dataclass(frozen=True, slots=True)
class ForeignTime:
    """A record another writer slot folds, as this slot's clocks see it (re-keyed).

    Attributes:
        record: The record (observed before this slot's later records of its partition).
        at: Its event time (ms).
    """

    record: SourceRecord
    at: int


@dataclass(frozen=True, slots=True)
class StreamMark:
    """A watermark marker on a derived topic, as the intake passes it by (never decoded).

    Attributes:
        record: The marker's record (its place in the log).
        marker: What it says.
    """

    record: SourceRecord
    marker: Marker


@dataclass(slots=True)
class Judged:
    """What :func:`judge_lateness` kept: records to fold, moved clocks, per-record marks."""

    kept: list[PendingRecord]
    clocks: dict[str, int]
    marks: list[int | None]


def judge_lateness(
    pipe: Pipeline,
    target: FoldTarget,
    slot: int | None,
    pending: Sequence[PendingRecord],
    foreign: Sequence[ForeignTime],
    markers: Sequence[StreamMark],
    timers: bool,
) -> tuple[Judged, list[DeadLetter], list[DeadLetter], int]:
    """Keep the on-time records (and the late ones under ``accept``); advance the clocks.

    Per partition, in log order, against the clock stored with its positions (read under the
    writer's guard): the same verdict for a record whatever the batch it is in.

    Args:
        pipe: The WATCHed pipeline (immediate mode).
        target: The generation (its keys, event time, topics and topics with markers).
        slot: The writer slot (None: co-partitioned).
        pending: This writer's records, in log order per partition.
        foreign: Re-keyed: the other slots' records of the chunk, observed only.
        markers: The chunk's watermark markers (derived topics), observed only.
        timers: The fold has timers (per record, its partition group's watermark).

    Returns:
        What to fold, the dead letters, the late side output, and how many were late.
    """
    event_time = cast("EventTime", target.event_time)
    everything = _slot_partitions(pipe, target, slot) if timers and slot is not None else None
    stored = _stored_clocks(pipe, target, slot, pending, foreign, timers, everything)
    clocks = TopicClocks(event_time, stored, frozenset(target.stream_topics))
    groups = GroupClocks(target.topics, event_time.lateness_ms, stored, everything)
    judged = Judged([], {}, [])
    dead: list[DeadLetter] = []
    late_out: list[DeadLetter] = []
    late = 0
    others: dict[str, deque[ForeignTime | StreamMark]] = {}
    # Per partition, in log order: only that order matters to a clock.
    observed: list[ForeignTime | StreamMark] = [*foreign, *markers]
    for other in sorted(observed, key=lambda o: o.record[:3]):
        name = position_field(other.record.topic, other.record.partition)
        others.setdefault(name, deque()).append(other)
    for item in pending:
        record, event_type, data, _entity = item
        field = position_field(record.topic, record.partition)
        before = others.get(field)
        while before and before[0].record.offset < record.offset:
            _observe(clocks, groups, before.popleft(), judged if timers else None)
        try:
            at = event_time_ms(data, event_time.field_of(event_type))
        except EventRejectedError as exc:
            dead.append(DeadLetter(record, "no-event-time", str(exc)))
            continue
        verdict = clocks.observe(record.topic, record.partition, stream_of(record.origin), at)
        mark = groups.advance(
            record.topic, record.partition, clocks.clock(record.topic, record.partition)
        )
        if verdict is not Verdict.ON_TIME:
            late += 1
        if is_folded(verdict, event_time):
            judged.kept.append(item)
            judged.marks.append(mark)
            continue
        _refuse(record, at, event_time, dead, late_out)
    for rest in others.values():
        for other in rest:
            _observe(clocks, groups, other, judged if timers else None)
    judged.clocks = clocks.changed
    return judged, dead, late_out, late


def _observe(
    clocks: TopicClocks,
    groups: GroupClocks,
    other: ForeignTime | StreamMark,
    ticks: Judged | None,
) -> None:
    """Another slot's record or a marker: it moves the clocks, and is not judged.

    With timers (``ticks``), it is kept as a *tick* (event type ``WATERMARK``, no entity): the
    fold fires the timers due at its watermark there, as at a record. So a derived partition
    whose last records came before their markers still fires them (the outputs' origin ids name
    the marker's offset: the same in every run), and a re-keyed slot fires its timers at the
    other slots' records too: after a transaction every timer due at or below the slot's
    watermark at its positions has fired, whichever of the partitions' records came last.
    """
    record = other.record
    if isinstance(other, StreamMark):
        clocks.mark(record.topic, record.partition, other.marker)
    else:
        clocks.observe(record.topic, record.partition, stream_of(record.origin), other.at)
    mark = groups.advance(
        record.topic, record.partition, clocks.clock(record.topic, record.partition)
    )
    if ticks is not None:
        ticks.kept.append((record, WATERMARK, {}, ""))
        ticks.marks.append(mark)


def _stored_clocks(
    pipe: Pipeline,
    target: FoldTarget,
    slot: int | None,
    pending: Sequence[PendingRecord],
    foreign: Sequence[ForeignTime],
    timers: bool,
    everything: Sequence[str] | None = None,
) -> dict[str, int]:
    """The stored clocks the chunk's partitions need, as this writer (slot) keeps them.

    With topics that carry markers, the whole hash (a partition's streams are not known in
    advance), this slot's copies only; otherwise the partitions' fields (re-keyed with timers:
    ``everything``, all of the processor's partitions, which hold the slot's watermark).
    """
    keys = target.keys
    if target.stream_topics:
        raw = cast("dict[bytes, bytes]", pipe.hgetall(keys.clocks))
        prefix = "" if slot is None else f"s{slot}|"
        stored = {}
        for name, value in raw.items():
            text = name.decode()
            if slot is None and text[:1] == "s" and text.partition("|")[0][1:].isdigit():
                continue  # a slot's copy (not a topic: topic names have no "|")
            if text.startswith(prefix):
                stored[text[len(prefix) :]] = int(value)
        return stored
    fields = {position_field(p[0].topic, p[0].partition) for p in pending}
    fields |= {position_field(f.record.topic, f.record.partition) for f in foreign}
    if everything is not None:  # re-keyed: every partition holds the slot's watermark back
        fields |= set(everything)
    elif timers:  # the group's other topics: their clocks hold its watermark back
        pids = {p[0].partition for p in pending}
        fields |= {position_field(t, pid) for t in target.topics for pid in pids}
    names = sorted(fields)
    stored_names = [slot_clock_field(slot, f) for f in names]
    got = cast("list[bytes | None]", pipe.hmget(keys.clocks, stored_names))
    return {f: int(v) for f, v in zip(names, got, strict=True) if v is not None}


def _slot_partitions(pipe: Pipeline, target: FoldTarget, slot: int) -> list[str]:
    """Every partition of a re-keyed generation: its slot's positions (one field each).

    The runner records every partition's starting position in every slot's hash before the
    generation's first batch (``GenerationPositions.start``), so these are the partitions whose
    clocks the slot's watermark waits for, as the generation's watermark waits for its
    positions' partitions.
    """
    names = cast("list[bytes]", pipe.hkeys(target.keys.slot_positions(slot)))
    return sorted(n.decode() for n in names if parse_position_field(n.decode()) is not None)


def _refuse(
    record: SourceRecord,
    at: int,
    event_time: EventTime,
    dead: list[DeadLetter],
    late_out: list[DeadLetter],
) -> None:
    """A late record that is not folded: a dead letter or the late side output."""
    behind = (
        f"event time {at} is more than {event_time.lateness_ms} ms behind the newest "
        f"event time seen on {record.topic}/{record.partition} before it"
    )
    if event_time.late == "accept":  # expired: beyond the retention
        detail = f"{behind}, and beyond the retention ({event_time.retention_ms} ms)"
        dead.append(DeadLetter(record, "expired", detail))
    elif event_time.late == "side-output":
        late_out.append(DeadLetter(record, "late", behind))
    else:
        dead.append(DeadLetter(record, "late", behind))


def write_clocks(
    pipe: Pipeline, keys: GenerationKeys, clocks: Mapping[str, int], slot: int | None, slots: int
) -> None:
    """Queue (inside MULTI) the clocks that moved; re-keyed, also the slots' minimum."""
    if not clocks:
        return
    mapping: dict[FieldT, EncodableT] = {slot_clock_field(slot, f): t for f, t in clocks.items()}
    pipe.hset(keys.clocks, mapping=mapping)
    partitions = sorted(f for f in clocks if "|" not in f)  # not the streams' clocks
    if slot is not None and partitions:
        pipelined_eval(pipe, _MIN_CLOCKS, 1, keys.clocks, slots, *partitions)
