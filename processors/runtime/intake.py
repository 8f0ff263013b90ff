"""Which records a fold transaction takes, and for which entity: the writer's intake.

Partitioned (:meth:`Intake.take`): partitions own the entities; every record above its
partition's applied position is decoded (unless its header says the fold does not read its
type) and keyed by the fold's ``key()``, which must be the record's Kafka key. Re-keyed
(:meth:`Intake.route`): writer slots own the entities of a processor keyed by another field
than its topics' partition keys; every slot reads every record, learns the links that lead
from a record to its entity (:mod:`refold.processors.fold.rekey`) and keeps its own. Records
that cannot be taken become dead letters with the reason.

On a topic that carries watermark markers (``FoldTarget.stream_topics``), a marker is passed
by, never decoded nor dead-lettered: to the lateness judge when the processor has an event
time (:class:`~refold.processors.runtime.lateness.StreamMark`); a record with the marker
header that is not a marker is dead-lettered ``bad-marker``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from redis.client import Pipeline

from refold.contracts.catalog import SchemaVersion
from refold.contracts.codec import DecodedEvent, EventCodec, writer_key
from refold.contracts.errors import DeserializationError
from refold.contracts.layout import position_field
from refold.contracts.schema_registry import SchemaRegistryUnavailableError
from refold.contracts.watermarks import is_marker, read_marker
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import EventRejectedError, Projection
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import KeyResolver, Link, decode_link, slot_of
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages
from refold.processors.runtime.lateness import ForeignTime, StreamMark

__all__ = ["Intake"]


class Intake:
    """The records one writer takes (picklable before first use, as the writer is).

    Args:
        target: Where the generation writes (its key, links, partition keys, slots).
        projection: The user's fold.
        codec: The contracts.
        slot: The writer slot of a re-keyed processor (None: partitions own the entities).
        keyed: The fold's kind keys records by entity (windows and lookups do not).
    """

    def __init__(
        self,
        target: FoldTarget,
        projection: Projection,
        codec: EventCodec,
        slot: int | None,
        *,
        keyed: bool,
    ) -> None:
        self.target = target
        self.projection = projection
        self.codec = codec
        self.slot = slot
        self.keyed = keyed
        self._resolver = KeyResolver(target.key_field, target.key_links)
        self._scanned: set[str] = set()
        self._partition_keys = dict(target.partition_keys)
        self._derived = frozenset(target.stream_topics)  # topics with watermark markers
        self._carries: dict[bytes, bool] = {}
        self._counts: dict[bytes, bool] = {}
        # Per topic, the links usable on it: those through its partition key (log order).
        self._via = {
            topic: tuple(v for v in target.key_links if v == pk)
            for topic, pk in target.partition_keys
        }

    def begin_task(self) -> None:
        """Forget what the last task learned (links, scanned partitions): a new task begins.

        Links learned in memory are facts of the log, but a task only needs those of the
        records it reads; everything before them is in Redis (:meth:`_learn_before`).
        """
        self._resolver = KeyResolver(self.target.key_field, self.target.key_links)
        self._scanned.clear()

    def take(
        self,
        records: Sequence[SourceRecord],
        applied_pos: Mapping[str, int],
        pending: list[tuple[SourceRecord, str, dict[str, Any], str]],
        dead: list[DeadLetter],
        new_pos: dict[str, int],
        outcome: BatchOutcome,
        markers: list[StreamMark] | None = None,
    ) -> None:
        """Entities owned by partitions: decode every record above its partition's position.

        The watermark markers of topics that carry them go to ``markers`` (see the module).
        """
        derived = self._derived
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
            if derived and record.topic in derived and is_marker(record.headers):
                self._pass_marker(record, markers, dead, outcome, owned=True)
                continue
            if not self._counted(record):
                outcome.passed += 1  # a type the processor does not fold: not even decoded
                continue
            letter = self._decode_and_key(record, pending)
            if letter is not None:
                dead.append(letter)

    def route(
        self,
        pipe: Pipeline,
        records: Sequence[SourceRecord],
        applied_pos: Mapping[str, int],
        pending: list[tuple[SourceRecord, str, dict[str, Any], str]],
        dead: list[DeadLetter],
        new_pos: dict[str, int],
        links: list[tuple[str, str, Link]],
        outcome: BatchOutcome,
        foreign: list[ForeignTime] | None = None,
        markers: list[StreamMark] | None = None,
    ) -> None:
        """Re-keyed: find each record's entity and keep those of this writer's slot.

        Every slot's task reads every record. It decodes those that carry the key (they make
        links: every slot learns them, also from records it has applied already) and those
        that may be its own; a record whose Kafka key links to another slot's entity is
        skipped undecoded (most of a re-keyed batch, measured: decoding was a third of a
        slot's time). It folds the records of its own entities and dead-letters the records
        it owns that cannot be folded (see :meth:`_linked_slot` for who owns those).

        With an event time, lateness is judged per source partition over every record the
        processor folds, whichever slot's: the records it would fold of other slots (not
        applied yet here) go to ``foreign`` with their event time, for this slot's clocks
        (:mod:`refold.processors.runtime.lateness`). Those are decoded too (the price of a
        re-keyed event-time processor), but only when their type is folded.
        """
        slot, slots = cast("int", self.slot), self.target.slots
        derived = self._derived
        self._learn_before(pipe, records)
        stored = self._stored_links(pipe, records)
        own = 0
        for record in records:
            field_name = position_field(record.topic, record.partition)
            done = record.offset < applied_pos.get(field_name, 0)
            if not done and record.offset >= new_pos.get(field_name, 0):
                new_pos[field_name] = record.offset + 1
            if derived and record.topic in derived and is_marker(record.headers):
                if not done:  # every slot's clocks see it; one slot owns a bad one
                    owned = zlib.crc32(record.key or b"") % slots == slot
                    own += owned
                    self._pass_marker(record, markers, dead, outcome, owned=owned)
                continue
            # Who owns the record when its event cannot say (a dead letter): the slot of the
            # link of its Kafka key (a partition key) when it has one here, else its key's
            # CRC. Every slot computes the same, from the same log prefix.
            linked = self._linked_slot(record, stored)
            owner = linked if linked is not None else zlib.crc32(record.key or b"") % slots
            if owner != slot and not self._carries_key(record):
                # Another slot's: its entity comes from that link; not decoded here unless
                # its event time counts (linked: it resolves; unlinked: key-missing there).
                if foreign is not None and linked is not None and not done:
                    self._clock_only(record, foreign)
                continue
            event = self._decode(record)
            if not isinstance(event, DeadLetter):
                # A record off its partition key's partition must not make or use links: its
                # order relative to the rest of its order_id (say) is not defined.
                event = self._check_partition_key(record, event)
            if isinstance(event, DeadLetter):
                if owner == slot and not done:
                    dead.append(event)
                    own += 1
                continue
            entity, made = self._resolver.resolve(
                record.offset, event.data, stored, self._via.get(record.topic, ())
            )
            links.extend(m for m in made if slot_of(m[2].key, slots) == slot)
            mine = (slot_of(entity, slots) == slot) if entity is not None else owner == slot
            if not mine:
                if foreign is not None and entity is not None and not done:
                    self._clock_event(record, event, foreign)
                continue
            own += 1
            if done:
                outcome.skipped += 1
                continue
            if event.event_type not in self.projection.event_types:
                outcome.passed += 1  # it may make links (above), but it is not folded
                continue
            letter = self._check_rekeyed(record, event, entity)
            if letter is not None:
                dead.append(letter)
                continue
            data = event.data
            if data.get(self.target.key_field) is None:
                data = {**data, self.target.key_field: entity}
            pending.append((record, event.event_type, data, cast("str", entity)))
        outcome.records = own

    def _pass_marker(
        self,
        record: SourceRecord,
        markers: list[StreamMark] | None,
        dead: list[DeadLetter],
        outcome: BatchOutcome,
        *,
        owned: bool,
    ) -> None:
        """A watermark marker: to ``markers`` (event time), a dead letter when it is bad."""
        try:
            marker = read_marker(record.headers)
        except ValueError as exc:
            if owned:
                dead.append(DeadLetter(record, "bad-marker", str(exc)))
            return
        if owned:
            outcome.passed += 1
        if marker is not None and markers is not None and self.target.event_time is not None:
            markers.append(StreamMark(record, marker))

    def _clock_only(self, record: SourceRecord, foreign: list[ForeignTime]) -> None:
        """Another slot's linked record: its event time, if that slot folds it."""
        if not self._counted(record):
            return
        event = self._decode(record)
        if not isinstance(event, DeadLetter):
            event = self._check_partition_key(record, event)
        if not isinstance(event, DeadLetter):
            self._clock_event(record, event, foreign)

    def _clock_event(
        self, record: SourceRecord, event: DecodedEvent, foreign: list[ForeignTime]
    ) -> None:
        """Another slot's record with its entity: its event time when that slot folds it."""
        event_time = self.target.event_time
        if event_time is None or event.event_type not in self.projection.event_types:
            return
        try:
            at = event_time_ms(event.data, event_time.field_of(event.event_type))
        except EventRejectedError:
            return  # a dead letter in its own slot ("no-event-time"): no part of the clock
        foreign.append(ForeignTime(record, at))

    def _decode(self, record: SourceRecord) -> DecodedEvent | DeadLetter:
        try:
            return self.codec.decode(record.value)
        except DeserializationError as exc:
            return DeadLetter(record, exc.reason, str(exc))
        except SchemaRegistryUnavailableError:
            raise  # the registry is down: the batch waits or fails, the record is not skipped
        except Exception as exc:  # the codec's own guard missed a kind: still this record only
            return DeadLetter(record, "undecodable", repr(exc))

    def _check_rekeyed(
        self, record: SourceRecord, event: DecodedEvent, entity: str | None
    ) -> DeadLetter | None:
        if entity is None:
            detail = (
                f"this {event.event_type} has no {self.target.key_field} and no earlier event "
                f"links it to one (through {', '.join(self.target.key_links) or 'no link'})"
            )
            return DeadLetter(record, "key-missing", detail)
        return None

    def _check_partition_key(
        self, record: SourceRecord, event: DecodedEvent
    ) -> DecodedEvent | DeadLetter:
        """Re-keyed: the record's Kafka key must be its topic's partition key field."""
        partition_key = self._partition_keys.get(record.topic)
        if not self.target.check_keys or partition_key is None:
            return event
        value = event.data.get(partition_key)
        if value is not None and record.key == str(value).encode():
            return event
        detail = (
            f"record key {record.key!r} is not the partition key {partition_key}={value!r} "
            f"of this {event.event_type}: it may sit on another partition than the events it "
            "links to. Operator action: produce it again keyed by "
            f"{partition_key} (the producer SDK does)."
        )
        return DeadLetter(record, "key-mismatch", detail)

    def _stored_links(
        self, pipe: Pipeline, records: Sequence[SourceRecord]
    ) -> dict[tuple[str, str], Link]:
        """The stored links of the records' Kafka keys, on topics partitioned by a link field.

        A well-keyed record's ``via`` value is its Kafka key (checked once decoded), so the
        links are read without decoding anything (one HMGET per link field).
        """
        stored: dict[tuple[str, str], Link] = {}
        for via in self.target.key_links:
            topics = {t for t, fields in self._via.items() if via in fields}
            values = sorted(
                {r.key.decode(errors="replace") for r in records if r.topic in topics and r.key}
            )
            if not values:
                continue
            raw = cast("list[bytes | None]", pipe.hmget(self.target.keys.links(via), values))
            for value, item in zip(values, raw, strict=True):
                if item is not None:
                    stored[(via, value)] = decode_link(item)
        return stored

    def _linked_slot(
        self, record: SourceRecord, stored: Mapping[tuple[str, str], Link]
    ) -> int | None:
        """The slot of the link of the record's Kafka key usable at its offset, if any."""
        if record.key is None:
            return None
        value = record.key.decode(errors="replace")
        for via in self._via.get(record.topic, ()):
            link = self._resolver.link_at((via, value), record.offset, stored)
            if link is not None:
                return slot_of(link.key, self.target.slots)
        return None

    def _counted(self, record: SourceRecord) -> bool:
        """Whether the processor folds the record's event type (read off its header).

        Records of unknown schemas are "counted": decoding them says why they are dead letters.
        A processor often folds some types of several on its topics (sales_windows:
        ``OrderPaid``, a tenth of the orders topic), so the others are never decoded.
        """
        types = self.projection.event_types
        return self._by_writer(record, self._counts, lambda writer: writer.name in types)

    def _carries_key(self, record: SourceRecord) -> bool:
        """Whether the record's writer schema has the entity key field (read off its header).

        Such records make links, so every slot decodes them; so are records whose schema is
        not known (the decode says why).
        """
        key = self.target.key_field
        return self._by_writer(
            record,
            self._carries,
            lambda writer: any(f.get("name") == key for f in writer.raw.get("fields", [])),
        )

    def _by_writer(
        self,
        record: SourceRecord,
        known: dict[bytes, bool],
        decide: Callable[[SchemaVersion], bool],
    ) -> bool:
        """``decide`` of the record's writer schema, once per writer key (True: unknown).

        Per writer key (fingerprint, or registry schema id), not ``writer_of`` per record: this
        runs for every record of the fold.
        """
        key = writer_key(record.value)
        if key is None:
            return True
        answer = known.get(key)
        if answer is None:
            writer = self.codec.writer_of(record.value)
            if writer is None:
                return True
            answer = known[key] = decide(writer)
        return answer

    def _learn_before(self, pipe: Pipeline, records: Sequence[SourceRecord]) -> None:
        """Learn the links of what the slowest slot has not applied yet, below ``records``.

        Links are written by the slot that owns their entity. Where another slot is behind
        this task's records (a crash mid-batch, Redis restored from a backup), links it has
        not written yet are read from the log here, so that every slot resolves alike.
        """
        if not self.target.key_links:
            return
        firsts: dict[str, SourceRecord] = {}
        for record in records:
            firsts.setdefault(position_field(record.topic, record.partition), record)
        fields = [f for f in firsts if f not in self._scanned]
        if not fields:
            return
        self._scanned.update(fields)
        # The generation's positions: the slowest slot's.
        low = self.target.positions(pipe).read_fields(fields)
        spans = [
            (firsts[f].topic, firsts[f].partition, v, firsts[f].offset)
            for f, v in low.items()
            if v < firsts[f].offset
        ]
        if not spans:
            return
        options = SourceOptions(
            kafka=self.target.kafka,
            topics=tuple(sorted({s[0] for s in spans})),
            archive_root=self.target.archive_root,
        )
        for chunk in read_messages(options, tuple(spans), slot="learn"):
            records = [SourceRecord.of_message(m) for m in chunk]
            events = []
            for record in records:
                event = self._decode(record)
                if not isinstance(event, DeadLetter):
                    event = self._check_partition_key(record, event)
                if not isinstance(event, DeadLetter):
                    events.append((record, event))
            stored = self._stored_links(pipe, [r for r, _e in events])
            for record, event in events:
                via = self._via.get(record.topic, ())
                self._resolver.resolve(record.offset, event.data, stored, via)

    def _decode_and_key(
        self,
        record: SourceRecord,
        pending: list[tuple[SourceRecord, str, dict[str, Any], str]],
    ) -> DeadLetter | None:
        """Decode one record and find its entity; a dead letter when that is not possible."""
        event = self._decode(record)
        if isinstance(event, DeadLetter):
            return event
        if not self.keyed:  # a window or lookup processor has no entity: any partition
            pending.append((record, event.event_type, event.data, ""))
            return None
        try:
            entity = str(self.projection.key(event.event_type, event.data))
        except Exception as exc:  # user code
            return DeadLetter(record, "fold-error", f"the processor's key() raised {exc!r}")
        if self.target.check_keys and record.key != entity.encode():
            # One writer per entity (DESIGN.md decision 8): an entity's records must all sit on
            # one partition, which only a Kafka key equal to the entity key guarantees.
            detail = (
                f"record key {record.key!r} is not the entity key {entity!r} of this "
                f"{event.event_type}: it may sit on another partition than the entity's other "
                "events, where another writer folds them. Operator action: produce it again "
                "keyed by the entity (the producer SDK does)."
            )
            return DeadLetter(record, "key-mismatch", detail)
        pending.append((record, event.event_type, event.data, entity))
        return None
