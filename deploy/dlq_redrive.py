"""``refold dlq redrive``: send selected dead letters' records back to their topic, once.

A dead letter (:mod:`refold.processors.runtime.dead_letters`) is the refused record's own key
and value with headers that say why (``refold.reason``), where it came from
(``refold.origin.topic/partition/offset``) and what its own headers were (``refold.headers``).
After a fix (a contract that now accepts the record, a processor that no longer refuses it) a
redrive produces each selected record again to its origin topic and partition, with its key,
value and headers byte for byte, as a new record at the end of the log.

**Once.** What was redriven is remembered per origin record in the processor's
``<prefix>:<processor>:dlq:redriven`` hash (``<topic>/<partition>@<offset>`` -> JSON), so a
second redrive of the same selection sends nothing, and a record dead-lettered several times
(two reasons, or letters sent again by an old rebuild) is sent back once. Each chunk of records:

1. is marked ``pending`` with the end offset of its target partitions;
2. is produced in one Kafka transaction (transactional id per processor and key prefix:
   starting a redrive fences an older one of the same processor still running);
3. is marked ``sent`` with the new offset, once the transaction committed.

A crash between 2 and 3 leaves ``pending`` marks. The next redrive, after fencing, reads each
pending record's partition from the offset noted in its mark (``read_committed``: an aborted
transaction's records are not there) and looks for a record equal to it byte for byte: found,
it is marked ``sent`` and not produced again; not found, it is produced. So a record is sent
once, unless another producer wrote an identical record (same key, value and headers) to that
partition between the mark and the crash: then it is taken as the redriven copy.

What a redrive does not do: the origin topic is read by every processor subscribed to it, and
one that applied the record before applies the copy again, unless it de-duplicates by event id
(``dedupe=EventId``). A record that carries ``refold.origin.id`` (another processor's output) is
skipped by a fold processor whose origin mark has passed it: replay the upstream instead.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis
from confluent_kafka import KafkaException, Message, Producer

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.outputs import output_producer
from refold.contracts.layout import StateLayout
from refold.contracts.origin import (
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_ID,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_PROCESSOR,
    ORIGIN_TOPIC,
    RECORD_HEADERS,
    decode_record_headers,
)
from refold.processors.runtime.kafka_ranges import SourceOptions, read_messages

__all__ = ["Letter", "RedriveError", "RedriveReport", "Redriver", "Selection", "read_letters"]

# Records per Kafka transaction (and per progress line).
CHUNK = 500
_TIMEOUT_S = 60.0

RecordHeaders = list[tuple[str, bytes | None]]


class RedriveError(RefoldError):
    """A redrive could not finish; what it marked ``sent`` is sent, the rest is not."""

    code = "REDRIVE_FAILED"
    retriable = True


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter as read from the dead-letter topic."""

    topic: str  # its record's origin
    partition: int
    offset: int
    reason: str
    processor: str
    generation: int | None
    key: bytes | None
    value: bytes | None
    headers: RecordHeaders | None  # the record's own; None: the letter does not say
    timer: bool  # describes a failing timer: its record was applied

    @property
    def origin(self) -> str:
        """``<topic>/<partition>@<offset>``: what a redrive is remembered by."""
        return f"{self.topic}/{self.partition}@{self.offset}"

    @property
    def derived(self) -> bool:
        """Its record is another processor's output (a fold skips it below its origin mark)."""
        return any(name == ORIGIN_ID for name, _v in self.headers or ())

    @classmethod
    def of_message(cls, message: Message) -> Letter | None:
        """The letter of a dead-letter topic's record; None when it is not a refold letter."""
        raw = cast("list[tuple[str, str | bytes | None]]", message.headers() or [])
        headers: dict[str, bytes] = {n: v for n, v in raw if isinstance(v, bytes)}
        try:
            topic = headers[ORIGIN_TOPIC].decode()
            partition = int(headers[ORIGIN_PARTITION])
            offset = int(headers[ORIGIN_OFFSET])
        except (KeyError, ValueError):
            return None
        generation = headers.get(ORIGIN_GENERATION)
        own = headers.get(RECORD_HEADERS)
        try:
            record_headers = None if own is None else decode_record_headers(own)
        except ValueError:
            record_headers = None
        return cls(
            topic,
            partition,
            offset,
            headers.get(DEAD_LETTER_REASON, b"").decode(),
            headers.get(ORIGIN_PROCESSOR, b"").decode(),
            int(generation) if generation is not None and generation.isdigit() else None,
            message.key(),
            message.value(),
            record_headers,
            "refold.timer" in headers,
        )


@dataclass(frozen=True, slots=True)
class Selection:
    """Which letters to redrive: the processor's, by reason and/or origin (all that are set).

    Attributes:
        processor: The letters' ``refold.processor``.
        reasons: Their reason is one of these (empty: any).
        topic: Their record's topic (None: any).
        partition: Its partition (None: any).
        from_offset: Its offset is at least this (None: no bound).
        to_offset: Its offset is at most this (None: no bound).
    """

    processor: str
    reasons: frozenset[str] = frozenset()
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None

    def matches(self, letter: Letter) -> bool:
        """Whether ``letter`` is selected."""
        return (
            letter.processor == self.processor
            and (not self.reasons or letter.reason in self.reasons)
            and (self.topic is None or letter.topic == self.topic)
            and (self.partition is None or letter.partition == self.partition)
            and (self.from_offset is None or letter.offset >= self.from_offset)
            and (self.to_offset is None or letter.offset <= self.to_offset)
        )


@dataclass(slots=True)
class RedriveReport:
    """What a redrive found and did."""

    read: int = 0  # letters read on the dead-letter topic
    matched: int = 0  # selected letters (records dead-lettered twice count twice)
    timers: int = 0  # selected, but describing a timer: never redriven
    unknown_headers: int = 0  # selected records whose letters do not carry their headers
    already: int = 0  # records redriven before
    sent: list[Letter] = field(default_factory=list)  # or, on a dry run, would be sent
    derived: int = 0  # of those, another processor's outputs (see the module docstring)


def read_letters(
    kafka: Mapping[str, str], topic: str, progress: Callable[[str], None] | None = None
) -> Iterator[Letter]:
    """Every refold dead letter on ``topic``, up to its end when the read starts.

    Raises:
        OffsetsError: The topic does not exist, or the broker does not answer.
    """
    with LogOffsets(dict(kafka)) as offsets:
        tps = [(topic, p) for p in offsets.partitions(topic)]
        starts = offsets.start_offsets(tps)
        ends = offsets.end_offsets(tps)
    ranges = tuple((t, p, starts[t, p], ends[t, p]) for t, p in tps if ends[t, p] > starts[t, p])
    total = sum(e - s for _t, _p, s, e in ranges)
    seen = 0
    options = SourceOptions(kafka=tuple(sorted(kafka.items())), topics=(topic,))
    for chunk in read_messages(options, ranges, "redrive"):
        seen += len(chunk)
        if progress is not None and total > CHUNK:
            progress(f"read {seen:,}/{total:,} records of {topic}")
        for message in chunk:
            letter = Letter.of_message(message)
            if letter is not None:
                yield letter


class Redriver:
    """Redrives a processor's letters once (see the module docstring).

    Args:
        kafka: librdkafka settings.
        client: Redis (the processor's ``dlq:redriven`` hash).
        layout: The processor's keys.
        progress: Called with a line now and then on a long run.
    """

    def __init__(
        self,
        kafka: Mapping[str, str],
        client: redis.Redis,
        layout: StateLayout,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.kafka = dict(kafka)
        self.client = client
        self.layout = layout
        self.progress = progress or (lambda _line: None)
        self.marks_key = layout.redriven

    def run(
        self, letters: Iterable[Letter], selection: Selection, *, dry_run: bool = False
    ) -> RedriveReport:
        """Redrive the selected letters' records not redriven yet; or, dry, list them.

        Raises:
            RedriveError: The broker refused or did not acknowledge a chunk (what was marked
                ``sent`` before it is sent; run the redrive again for the rest).
        """
        report = RedriveReport()
        chosen: dict[str, Letter] = {}
        for letter in letters:
            report.read += 1
            if not selection.matches(letter):
                continue
            report.matched += 1
            if letter.timer:
                report.timers += 1
            elif letter.headers is None:
                report.unknown_headers += 1
            else:
                chosen.setdefault(letter.origin, letter)
        producer = None if dry_run or not chosen else self._producer()
        todo = self._not_redriven(list(chosen.values()), report, record=not dry_run)
        report.sent = todo
        report.derived = sum(letter.derived for letter in todo)
        if producer is not None:
            for start in range(0, len(todo), CHUNK):
                self._send(producer, todo[start : start + CHUNK])
                if len(todo) > CHUNK:
                    self.progress(f"sent {min(start + CHUNK, len(todo)):,}/{len(todo):,}")
        return report

    def _producer(self) -> Producer:
        """The processor's transactional producer; fences an older redrive still running."""
        producer = output_producer(
            {
                **self.kafka,
                "transactional.id": f"refold.redrive.{self.layout.prefix}.{self.layout.processor}",
            }
        )
        try:
            producer.init_transactions(_TIMEOUT_S)
        except KafkaException as exc:
            msg = f"cannot start a Kafka transaction for the redrive: {exc}"
            raise RedriveError(msg) from exc
        return producer

    def _not_redriven(
        self, letters: list[Letter], report: RedriveReport, *, record: bool
    ) -> list[Letter]:
        """The letters whose record was not redriven; resolves the pending marks of a crash."""
        if not letters:
            return []
        raw = cast(
            "list[bytes | None]", self.client.hmget(self.marks_key, [x.origin for x in letters])
        )
        todo = []
        for letter, mark in zip(letters, raw, strict=True):
            state = None if mark is None else orjson.loads(mark)
            if state is not None and state["state"] == "pending":
                found = _find_copy(self.kafka, letter, int(state["from"]))
                if found is not None:
                    if record:
                        self._mark([letter], "sent", {letter.origin: found})
                    state = {"state": "sent"}
            if state is not None and state["state"] == "sent":
                report.already += 1
            else:
                todo.append(letter)
        return todo

    def _send(self, producer: Producer, letters: Sequence[Letter]) -> None:
        """One chunk: mark pending, produce in a transaction, mark sent."""
        with LogOffsets(self.kafka) as offsets:
            ends = offsets.end_offsets({(x.topic, x.partition) for x in letters})
        self._mark(letters, "pending", {x.origin: ends[x.topic, x.partition] for x in letters})
        delivered: dict[str, int] = {}
        failures: list[str] = []

        def done(origin: str) -> Callable[[Any, Message], None]:
            def callback(err: Any, message: Message) -> None:
                if err is not None:
                    failures.append(str(err))
                else:
                    delivered[origin] = message.offset() or 0

            return callback

        try:
            producer.begin_transaction()
            for x in letters:
                producer.produce(
                    x.topic,
                    x.value,
                    x.key,
                    partition=x.partition,
                    headers=cast("list[tuple[str, str | bytes | None]]", x.headers),
                    on_delivery=done(x.origin),
                )
            producer.commit_transaction(_TIMEOUT_S)
        except KafkaException as exc:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(_TIMEOUT_S)
            msg = (
                f"{len(letters)} records not redriven ({exc}; {'; '.join(failures[:3])}); "
                "they are marked pending: run the redrive again"
            )
            raise RedriveError(msg) from exc
        self._mark(letters, "sent", delivered)

    def _mark(self, letters: Sequence[Letter], state: str, where: Mapping[str, int]) -> None:
        now = int(time.time() * 1000)
        key = "from" if state == "pending" else "offset"
        marks: dict[str | bytes, bytes] = {
            x.origin: orjson.dumps(
                {
                    "state": state,
                    "reason": x.reason,
                    "to": f"{x.topic}/{x.partition}",
                    key: where[x.origin],
                    "at_ms": now,
                }
            )
            for x in letters
        }
        self.client.hset(self.marks_key, mapping=cast("Any", marks))


def _find_copy(kafka: Mapping[str, str], letter: Letter, start: int) -> int | None:
    """The offset of a record equal to ``letter``'s at or past ``start`` on its partition."""
    with LogOffsets(dict(kafka)) as offsets:
        end = offsets.end_offsets([(letter.topic, letter.partition)])[
            letter.topic, letter.partition
        ]
    if end <= start:
        return None
    options = SourceOptions(kafka=tuple(sorted(kafka.items())), topics=(letter.topic,))
    wanted = (letter.key, letter.value, letter.headers or [])
    for chunk in read_messages(options, ((letter.topic, letter.partition, start, end),), "redrive"):
        for message in chunk:
            if (message.key(), message.value(), list(message.headers() or [])) == wanted:
                return message.offset()
    return None
