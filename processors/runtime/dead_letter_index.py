"""Dead letters once: what a generation decided, and what no generation may send again.

Every generation records the letters it decided, dead letters and late records alike, in its
``dl:letters`` hash (:attr:`~refold.contracts.layout.GenerationKeys.dead_letters`): the field
is the record's origin and the letter's rank among that record's letters
(``<topic>/<partition>@<offset>.<n>``: a record refused by the fold has one letter, a record
that also fired failing timers has more), the value its reason. The hash is written in the
transaction that moves the positions, so it holds the letters of exactly the applied records.

What was *sent* is the processor's, not a generation's: the ``dl:sent`` ledger
(:attr:`~refold.contracts.layout.StateLayout.letters_sent`) holds ``<field>|<reason>`` for
every letter any generation sent (written once the letters are committed in Kafka, before the
positions move). Every generation, live or building, skips a letter the ledger holds: a
rebuild does not send again what the live generation sent, a rollback does not send again what
the rolled-back-over generation sent, a live generation does not send again what an abandoned
build sent ahead of it, and a seeded or restarted one neither. A letter with another reason
(the new code refuses the record for a new reason, or refuses a record the old code applied)
is sent, and its headers name the generation that sent it. A Redis that lost the ledger gets it
back from the dead-letter topics (:mod:`refold.processors.runtime.sent_outputs`).

A live generation written before the ledger existed has only its index: a building generation
also skips the letters the live one decided for the records it has applied (same origin and
reason), as it did before the ledger.

Every engine decides the same way, through :func:`decide_letters` (the fold envelope, the
DataFrame decode task, the archive task): it reads, before its transaction, the ledger and
whether its generation is building and what the live one decided, then records the letters in
the ledger (:func:`record_sent`) once Kafka has them, and writes the entries it returns with
its positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field as dataclass_field
from typing import cast

import redis
from confluent_kafka import Producer
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from refold.contracts.kafka.outputs import Deliveries
from refold.contracts.layout import (
    GenerationKeys,
    StateLayout,
    parse_position_field,
    position_field,
)
from refold.contracts.store.generations import GenerationRegistry, status_and_live
from refold.contracts.store.positions import GenerationPositions
from refold.processors.runtime.dead_letters import DeadLetter, produce_letters
from refold.processors.runtime.fold_target import FoldTarget

__all__ = [
    "LetterDecision",
    "ReasonSummary",
    "building_against",
    "decide_letters",
    "index_fields",
    "letters_to_send",
    "record_sent",
    "send_once",
    "summarise_index",
]


def index_fields(letters: Sequence[DeadLetter]) -> list[str]:
    """Each letter's field in the index: its record's origin and its rank among that record's."""
    seen: dict[tuple[str, int, int], int] = {}
    fields = []
    for letter in letters:
        origin = letter.record[:3]
        rank = seen.get(origin, 0)
        seen[origin] = rank + 1
        fields.append(f"{position_field(origin[0], origin[1])}@{origin[2]}.{rank}")
    return fields


def letters_to_send(
    letters: Sequence[DeadLetter],
    fields: Sequence[str],
    live_positions: Mapping[str, int],
    live_reasons: Iterable[str | None],
) -> list[int]:
    """The indices of the letters a building generation sends (pure).

    Args:
        letters: The batch's letters, in order.
        fields: Their :func:`index_fields`.
        live_positions: The live generation's applied positions (``<topic>/<partition>`` ->
            next offset) of the letters' partitions.
        live_reasons: The live generation's reason for each field (``None``: it has none).
    """
    send = []
    for index, (letter, _field, live_reason) in enumerate(
        zip(letters, fields, live_reasons, strict=True)
    ):
        topic, partition, offset = letter.record[:3]
        applied_by_live = offset < live_positions.get(position_field(topic, partition), 0)
        if not applied_by_live or live_reason != letter.reason:
            send.append(index)
    return send


def building_against(
    client: redis.Redis,
    layout: StateLayout,
    generation: int,
    partitions: Iterable[tuple[str, int]],
) -> tuple[int | None, dict[str, int]] | None:
    """What a building generation compares with: the live generation and its positions.

    Args:
        client: The plain client, not a WATCHing pipeline: these keys are in other hash slots
            than a transaction's (the registry's, the live generation's), on a cluster.
        layout: The processor's keys.
        generation: The generation that decides.
        partitions: ``(topic, partition)`` whose live positions matter.

    Returns:
        ``None`` unless ``generation`` is ``building``; else the live generation (``None``:
        there is none) and its applied positions of ``partitions``.
    """
    status, live = status_and_live(client, layout, generation)
    if status != "building":
        return None
    if live is None or live == generation:
        return None, {}
    fields = sorted({position_field(topic, partition) for topic, partition in partitions})
    return live, GenerationPositions(client, _keys(client, layout, live)).read_fields(fields)


def _live_letters(
    client: redis.Redis | Pipeline,
    keys: GenerationKeys,
    letters: Sequence[DeadLetter],
    fields: Sequence[str],
) -> list[bytes | None]:
    """The live generation's entries of ``fields``: one HMGET, or one per shard it is in."""
    by_shard: dict[int, list[int]] = {}
    for i, letter in enumerate(letters):
        by_shard.setdefault(letter.record[1] if keys.shards else 0, []).append(i)
    found: list[bytes | None] = [None] * len(fields)
    for shard, indices in by_shard.items():
        names = [fields[i] for i in indices]
        raw = cast("list[bytes | None]", client.hmget(keys.for_shard(shard).dead_letters, names))
        for i, value in zip(indices, raw, strict=True):
            found[i] = value
    return found


def _keys(client: redis.Redis | Pipeline, layout: StateLayout, generation: int) -> GenerationKeys:
    """A generation's keys, sharded as its meta records (the registry's reading of it)."""
    return GenerationRegistry(client, layout).keys(generation)


@dataclass(slots=True)
class LetterDecision:
    """Which of a batch's letters to send, and the index entries to write with the positions.

    Attributes:
        send: The indices of the letters to send, in order.
        entries: Every letter's index entry (``<topic>/<p>@<offset>.<n>`` -> reason), sent or
            not: the generation decided them all.
        ranks: Each letter's rank among its record's letters (its ``refold.letter.rank``).
        sent: The ledger entries to add once the letters are in Kafka (``<field>|<reason>``
            -> the generation that sent it): those sent now, and those the live generation's
            index says it sent before the ledger existed.
    """

    send: list[int] = dataclass_field(default_factory=list)
    entries: dict[str, str] = dataclass_field(default_factory=dict)
    ranks: list[int] = dataclass_field(default_factory=list)
    sent: dict[str, str] = dataclass_field(default_factory=dict)

    @property
    def suppressed(self) -> int:
        """How many letters the live generation sent already."""
        return len(self.entries) - len(self.send)


def ledger_fields(letters: Sequence[DeadLetter], fields: Sequence[str]) -> list[str]:
    """Each letter's field in the processor's ``dl:sent`` ledger: ``<index field>|<reason>``."""
    return [f"{field}|{letter.reason}" for field, letter in zip(fields, letters, strict=True)]


def _rank(field: str) -> int:
    return int(field.rpartition(".")[2])


def decide_letters(
    client: redis.Redis,
    layout: StateLayout,
    generation: int,
    letters: Sequence[DeadLetter],
) -> LetterDecision:
    """What ``generation`` does with ``letters`` (read before the writer's transaction).

    It sends those the processor's ledger does not hold (no generation sent them); a building
    one also skips those the live generation's index holds for the same record and reason.
    """
    if not letters:
        return LetterDecision()
    fields = index_fields(letters)
    ledger = ledger_fields(letters, fields)
    senders = cast("list[bytes | None]", client.hmget(layout.letters_sent, ledger))
    send = [i for i, sender in enumerate(senders) if sender is None]
    sent = {ledger[i]: str(generation) for i in send}
    live = building_against(client, layout, generation, {letter.record[:2] for letter in letters})
    if live is not None and live[0] is not None and send:
        raw = _live_letters(client, _keys(client, layout, live[0]), letters, fields)
        reasons = [None if r is None else r.decode() for r in raw]
        by_live = set(send) - set(letters_to_send(letters, fields, live[1], reasons))
        send = [i for i in send if i not in by_live]
        sent.update({ledger[i]: str(live[0]) for i in by_live})
    entries = {f: letter.reason for f, letter in zip(fields, letters, strict=True)}
    return LetterDecision(send, entries, [_rank(f) for f in fields], sent)


def record_sent(client: redis.Redis, layout: StateLayout, decision: LetterDecision) -> None:
    """Add the decision's letters to the ledger: call once Kafka has them (acked or committed).

    Never before: a letter in the ledger is never sent again, by any generation. A crash
    between the two leaves a letter sent and not in the ledger; the same generation's re-run
    does not send it again (its markers, or its index), and the ledger gets it then.
    """
    if decision.sent:
        mapping: dict[FieldT, EncodableT] = dict(decision.sent.items())
        client.hset(layout.letters_sent, mapping=mapping)


def send_once(
    client: redis.Redis,
    producer: Producer,
    target: FoldTarget,
    letters: Sequence[DeadLetter],
    batch_id: int | None = None,
) -> LetterDecision:
    """Decide ``letters``, send those to send to the dead-letter topic, wait for every ack.

    For the engines that send letters outside a Kafka transaction (the DataFrame decode task,
    the archive task); the ledger gets them once acknowledged, the caller writes the
    decision's entries.

    Raises:
        DeadLetterError: A letter was not acknowledged (the caller commits nothing).
    """
    decision = decide_letters(client, target.layout, target.generation, letters)
    chosen = [letters[i] for i in decision.send]
    if chosen:
        sent = Deliveries(producer, f"{len(chosen)} dead letters to {target.dlq_topic}")
        produce_letters(
            sent,
            target.dlq_topic,
            chosen,
            target.processor,
            target.generation,
            batch_id,
            [decision.ranks[i] for i in decision.send],
        )
        sent.wait()
    record_sent(client, target.layout, decision)
    return decision


@dataclass(frozen=True, slots=True)
class ReasonSummary:
    """The letters of one reason in a generation's index (``refold dlq list``)."""

    reason: str
    count: int
    first: tuple[str, ...]  # the first origins, ``<topic>/<partition>@<offset>``, in log order


def _origin_order(field: str) -> tuple[str, int, int, int]:
    origin, _, rank = field.rpartition(".")
    where, _, offset = origin.rpartition("@")
    topic, partition = parse_position_field(where) or (where, 0)
    return topic, partition, int(offset), int(rank)


def summarise_index(entries: Mapping[str, str], examples: int = 3) -> list[ReasonSummary]:
    """A generation's dead-letter index by reason, the commonest first (pure).

    Args:
        entries: The index: ``<topic>/<partition>@<offset>.<n>`` -> reason.
        examples: How many origins to name per reason, the first in log order.
    """
    by_reason: dict[str, list[str]] = {}
    for field, reason in entries.items():
        by_reason.setdefault(reason, []).append(field)
    summaries = []
    for reason, fields in by_reason.items():
        fields.sort(key=_origin_order)
        first = tuple(dict.fromkeys(f.rpartition(".")[0] for f in fields))[:examples]
        summaries.append(ReasonSummary(reason, len(fields), first))
    return sorted(summaries, key=lambda s: (-s.count, s.reason))
