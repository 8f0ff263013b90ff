"""Dead letters: what a record that was not applied becomes, and how its sending is logged.

Every engine (the fold envelope, the DataFrame and archive sinks, the lookup joiner) sends the
records it cannot apply to the processor's dead-letter topic the same way: the record's own key
and value, with headers that give the reason, the error and the origin
(:func:`refold.contracts.origin.dead_letter_headers`), each letter's detail logged at DEBUG and
one WARNING line per chunk. A batch of bad input used to log one line per record (677 of a
processor's first 807 log lines, without processor or origin).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from refold.contracts.kafka.outputs import Deliveries
from refold.contracts.origin import (
    RECORD_HEADERS,
    Headers,
    dead_letter_headers,
    encode_record_headers,
)
from refold.processors.fold.records import SourceRecord

__all__ = [
    "LETTER_RANK",
    "DeadLetter",
    "letter_message",
    "log_letters",
    "produce_letters",
    "summarise_letters",
]

logger = logging.getLogger(__name__)

# A letter's rank among its record's letters (0: the first; a record whose timers failed has
# more): with the origin and the reason, what makes it one letter over every generation
# (the ``dl:sent`` ledger, read back from the topic when Redis lost it).
LETTER_RANK = "refold.letter.rank"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that was not applied (or, ``timer``: a timer that failed, the record applied).

    Attributes:
        record: The record (its origin, key and value go to the dead-letter topic).
        reason: Its ``refold.reason`` (``bad-body``, ``rejected``, ``late``...).
        detail: Its error, for people.
        timer: The record was applied and the letter describes its failing timer.
    """

    record: SourceRecord
    reason: str
    detail: str
    timer: bool = False


def letter_message(
    letter: DeadLetter, processor: str, generation: int, rank: int = 0
) -> tuple[bytes | None, bytes | None, Headers]:
    """The ``(value, key, headers)`` a letter is sent as.

    The record's own key and value, and its own headers in one ``refold.headers`` header (when
    the source read them), so ``refold dlq redrive`` can send it back as it was. ``rank``: its
    place among its record's letters (``refold.letter.rank``).
    """
    record = letter.record
    headers = dead_letter_headers(letter.reason, letter.detail, record[:3], processor, generation)
    headers.append((LETTER_RANK, str(rank).encode()))
    value = record.value
    if letter.timer:  # the record was applied: the letter describes the timer
        headers.append(("refold.timer", b"1"))
        value = orjson.dumps({"timer": letter.detail})
    elif record.headers is not None:
        headers.append((RECORD_HEADERS, encode_record_headers(record.headers)))
    return value, record.key, headers


def summarise_letters(letters: Sequence[DeadLetter], topic: str) -> str:
    """One line for a chunk's dead letters: the count per reason with its first origin."""
    by_reason: dict[str, list[DeadLetter]] = {}
    for letter in letters:
        by_reason.setdefault(letter.reason, []).append(letter)
    parts = []
    for reason, group in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        first = group[0].record
        parts.append(
            f"{reason} x{len(group)} (first {first.topic}/{first.partition}@{first.offset}: "
            f"{group[0].detail[:200]})"
        )
    return f"{len(letters)} record(s) to {topic}: " + "; ".join(parts)


def log_letters(
    letters: Sequence[DeadLetter],
    topic: str,
    processor: str,
    generation: int,
    batch_id: int | None = None,
) -> None:
    """Each letter's detail at DEBUG (with its origin), then one WARNING line for them all."""
    for letter in letters:
        record = letter.record
        logger.debug(
            "to %s (%s): %s",
            topic,
            letter.reason,
            letter.detail,
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "batch_id": batch_id,
            },
        )
    if letters:
        logger.warning(
            "%s",
            summarise_letters(letters, topic),
            extra={"processor": processor, "generation": generation, "batch_id": batch_id},
        )


def produce_letters(
    sent: Deliveries,
    topic: str,
    letters: Sequence[DeadLetter],
    processor: str,
    generation: int,
    batch_id: int | None = None,
    ranks: Sequence[int] | None = None,
) -> None:
    """Queue ``letters`` on ``sent`` and log them; the caller waits for the acknowledgements.

    ``ranks``: each letter's rank among its record's letters (default: all 0).
    """
    for letter, rank in zip(letters, ranks or [0] * len(letters), strict=True):
        value, key, headers = letter_message(letter, processor, generation, rank)
        sent.produce(topic, value, key, headers)
    log_letters(letters, topic, processor, generation, batch_id)
