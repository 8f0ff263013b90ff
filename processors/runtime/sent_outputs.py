"""What a processor's earlier runs already sent, read back from Kafka: outputs once without Redis.

Redis holds what says an output was sent: a generation's markers name, its dead-letter index,
the processor's ``dl:sent`` ledger. A Redis that comes back empty (a restart without
persistence, a FLUSHALL, a lost volume) loses all of it, and the processor starts over in a
new generation that would send every output again. Kafka keeps the two facts that matter:

- **The marker groups** (:func:`~refold.processors.runtime.output_transactions.marker_group`):
  every generation that sent outputs committed, in the same Kafka transaction as those outputs,
  how far each source partition's outputs are written. :func:`committed_floor` reads them all,
  for every generation the processor had, and a writer drops the side effects (output streams,
  insights) of the records below the highest: some generation sent them already.
- **The dead-letter and late topics**: each letter names its origin, its reason, and (since
  this ledger) its rank among its record's letters. :func:`recover_sent_letters` writes them
  back into the processor's ``dl:sent`` ledger when the ledger lacks its ``~recovered`` field,
  before the first batch of a new run (:mod:`refold.processors.runtime.dead_letter_index`).

Lifecycle: driver side, called when a processor takes a generation's lease, before its query
starts; live client code (not picklable).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import redis
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.kafka.consumers import passive_consumer, passive_consumer_config
from refold.contracts.kafka.logs import routed
from refold.contracts.kafka.offsets import LogOffsets, OffsetsError
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.origin import (
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_PROCESSOR,
    ORIGIN_TOPIC,
)
from refold.processors.runtime.dead_letters import LETTER_RANK
from refold.processors.runtime.fold_target import FoldTarget
from refold.processors.runtime.output_transactions import marker_group

__all__ = [
    "SENT_RECOVERED",
    "committed_floor",
    "letters_of",
    "recover_sent_letters",
    "with_sent_outputs",
]

logger = logging.getLogger(__name__)

SourceTP = tuple[str, int]
# The ledger's field that says it holds every letter of the dead-letter topics (epoch ms).
SENT_RECOVERED = "~recovered"
# Broker calls of a recovery: a broker that does not answer in this long fails the start.
_TIMEOUT_S = 30.0
# One try of a marker read (a coordinator that moves or loads is asked again until _TIMEOUT_S).
_STEP_S = 10.0
# Ledger entries per HSET while recovering (one round trip each).
_CHUNK = 5_000
# Records per consume() while reading a dead-letter topic back.
_BATCH = 5_000


def _headers(message: Message) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in cast("list[tuple[str, bytes | None]]", message.headers() or []):
        if value is not None:
            found[name] = value.decode(errors="replace")
    return found


def letters_of(processor: str, messages: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The ledger entries of dead-letter records' headers, in log order (pure).

    A letter's field is ``<topic>/<partition>@<offset>.<rank>|<reason>`` and its value the
    generation that sent it (the first to). A letter written before refold named its rank
    (no ``refold.letter.rank``) takes its place among its record's letters of the same
    generation. Records of other processors, and those without an origin or a reason, are
    no letters of this processor's.
    """
    entries: dict[str, str] = {}
    ranks: Counter[tuple[str, str]] = Counter()
    for headers in messages:
        if headers.get(ORIGIN_PROCESSOR, processor) != processor:
            continue
        try:
            topic = headers[ORIGIN_TOPIC]
            origin = (
                f"{position_field(topic, int(headers[ORIGIN_PARTITION]))}"
                f"@{int(headers[ORIGIN_OFFSET])}"
            )
            reason = headers[DEAD_LETTER_REASON]
        except (KeyError, ValueError):
            continue
        generation = headers.get(ORIGIN_GENERATION, "")
        rank_text = headers.get(LETTER_RANK, "")
        if rank_text.isdigit():
            rank = int(rank_text)
        else:
            rank = ranks[origin, generation]
            ranks[origin, generation] += 1
        entries.setdefault(f"{origin}.{rank}|{reason}", generation)
    return entries


def _read_back(kafka: Mapping[str, Any], topics: Sequence[str]) -> Iterator[dict[str, str]]:
    """The headers of every committed record of ``topics`` (those that exist), in log order."""
    with LogOffsets(kafka, timeout=_TIMEOUT_S) as offsets:
        tps: list[SourceTP] = []
        for topic in dict.fromkeys(topics):
            try:
                tps += [(topic, p) for p in offsets.partitions(topic)]
            except OffsetsError:
                continue  # not created yet: nothing was sent to it
        if not tps:
            return
        starts = offsets.start_offsets(tps)
        ends = offsets.end_offsets(tps)
    left = {tp: end for tp, end in ends.items() if end > starts[tp]}
    if not left:
        return
    consumer = passive_consumer(kafka, "refold.sent-letters", isolation="read_committed")
    try:
        consumer.assign([TopicPartition(t, p, starts[t, p]) for t, p in sorted(left)])
        deadline = time.monotonic() + _TIMEOUT_S
        while left:
            messages = consumer.consume(_BATCH, 0.5)
            for message in messages:
                if message.error() is None:
                    yield _headers(message)
            if messages:
                deadline = time.monotonic() + _TIMEOUT_S
            # Transaction markers and aborted records take offsets no record is read from:
            # the consumer's position, not the last record, says where it is.
            for tp in consumer.position([TopicPartition(t, p) for t, p in left]):
                if tp.offset >= left[tp.topic, tp.partition]:
                    del left[tp.topic, tp.partition]
            if left and time.monotonic() > deadline:
                msg = f"reading back the dead letters of {sorted(left)} timed out"
                raise KafkaException(msg)
    finally:
        consumer.close()


def recover_sent_letters(
    client: redis.Redis,
    layout: StateLayout,
    kafka: Mapping[str, Any],
    topics: Sequence[str],
) -> int | None:
    """Fill the processor's ``dl:sent`` ledger from its dead-letter topics, when it lost them.

    The ledger says it is complete with its ``~recovered`` field: a ledger without it (a new
    processor, a Redis that came back empty, an upgrade from before the ledger) is filled from
    every committed letter of ``topics`` (the dead-letter topic and the late topic) first.

    Returns:
        The letters read back, or ``None`` when the ledger was complete.
    """
    key = layout.letters_sent
    if client.hexists(key, SENT_RECOVERED):
        return None
    started = time.monotonic()
    entries = letters_of(layout.processor, list(_read_back(kafka, topics)))
    names = list(entries)
    for i in range(0, len(names), _CHUNK):
        chunk = names[i : i + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for name in chunk:  # the first sender's generation stays
            pipe.hsetnx(key, name, entries[name])
        pipe.execute()
    client.hset(key, SENT_RECOVERED, str(int(time.time() * 1000)))
    if entries:
        logger.warning(
            "%s: the ledger of dead letters sent was not in Redis (restarted empty?); read "
            "%d back from %s in %.1fs: they are not sent again",
            layout.processor,
            len(entries),
            ", ".join(topics),
            time.monotonic() - started,
        )
    return len(entries)


def _group_pattern(key_prefix: str, processor: str) -> re.Pattern[str]:
    """The marker groups of every generation of ``processor`` (with no writer slots)."""
    head = re.escape(marker_group(key_prefix, processor, 0, None).removesuffix(".g0"))
    return re.compile(rf"{head}\.g\d+(\.t\d+)?")


def _committed(
    kafka: Mapping[str, Any], group: str, tps: list[TopicPartition]
) -> list[TopicPartition]:
    """A marker group's committed offsets of ``tps``, waiting out a coordinator that loads.

    Through a consumer of the group (as the writers read their markers), not the AdminClient:
    librdkafka 2.16's admin OffsetFetch crashed the process on a coordinator that was loading
    (a NULL consumer group handle in ``rd_kafka_cgrp_op``).
    """
    config = passive_consumer_config(kafka, group, isolation="read_committed")
    consumer = Consumer(routed(config))
    try:
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                return list(consumer.committed(tps, timeout=_STEP_S))
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def committed_floor(
    kafka: Mapping[str, Any],
    key_prefix: str,
    processor: str,
    topics: Sequence[str],
) -> dict[SourceTP, int]:
    """How far every generation of ``processor`` has committed outputs, per source partition.

    The highest offset that any of its marker groups (a partition-owned processor's: no
    writer slots) holds for each partition of ``topics``. Offsets past a source partition's
    log end are left out: the topic was recreated, and they speak of records that are gone.

    Raises:
        KafkaException: The broker did not answer.
        OffsetsError: A topic is not there, or the broker did not answer.
    """
    admin = AdminClient({**kafka, "log_level": 0})
    listed = admin.list_consumer_groups(request_timeout=_TIMEOUT_S).result()
    pattern = _group_pattern(key_prefix, processor)
    groups = sorted(g.group_id for g in listed.valid if pattern.fullmatch(g.group_id))
    if not groups:
        return {}
    with LogOffsets(kafka, timeout=_TIMEOUT_S) as offsets:
        sources = [(t, p) for t in dict.fromkeys(topics) for p in offsets.partitions(t)]
        ends = offsets.end_offsets(sources)
    floor: dict[SourceTP, int] = {}
    wanted = [TopicPartition(t, p) for t, p in sources]
    for group in groups:
        for tp in _committed(kafka, group, wanted):
            key = (tp.topic, tp.partition)
            # Past the log end: the topic was recreated since; those records are gone.
            if floor.get(key, 0) < tp.offset <= ends[key]:
                floor[key] = tp.offset
    return floor


def with_sent_outputs(client: redis.Redis, target: FoldTarget) -> FoldTarget:
    """``target`` knowing what the processor's earlier runs sent, before its query starts.

    Fills the ``dl:sent`` ledger from the dead-letter and late topics if Redis lost it
    (:func:`recover_sent_letters`), and sets :attr:`FoldTarget.output_floor` from every
    generation's marker groups (:func:`committed_floor`; not for a re-keyed processor, whose
    writer slots each commit their own). A broker that does not answer is logged: the run
    goes on, its outputs at least once.
    """
    kafka = dict(target.kafka)
    try:
        recover_sent_letters(client, target.layout, kafka, [target.dlq_topic, target.late_topic])
    except (KafkaException, OffsetsError) as exc:
        logger.warning(
            "%s: the dead letters already sent were not read back (%s); letters the lost "
            "Redis knew may be sent again",
            target.processor,
            exc,
        )
    if target.slots:
        return target
    try:
        floor = committed_floor(kafka, target.key_prefix, target.processor, target.topics)
    except (KafkaException, OffsetsError) as exc:
        logger.warning(
            "%s: the outputs already committed were not read back (%s); outputs another "
            "generation sent may be sent again",
            target.processor,
            exc,
        )
        return target
    if floor:
        logger.info(
            "%s g%d: outputs committed by its generations up to %s",
            target.processor,
            target.generation,
            ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(floor.items())),
        )
    return dataclasses.replace(
        target, output_floor=tuple((t, p, o) for (t, p), o in sorted(floor.items()))
    )
