"""A fold batch's dead letters and late side output: counted, then queued in its outbox.

The letters go out in the batch's Kafka transaction
(:mod:`refold.processors.runtime.output_transactions`), before its Redis transaction. No
generation queues a letter another sent already (the ``dl:sent`` ledger:
:mod:`refold.processors.runtime.dead_letter_index`); the writer records those it sent once
their transaction is committed (:func:`~refold.processors.runtime.dead_letter_index.record_sent`).

Lifecycle: pure functions of a Redis client and a target; they run where the writer runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import redis

from refold.processors.runtime.dead_letter_index import LetterDecision, decide_letters
from refold.processors.runtime.dead_letters import DeadLetter, letter_message, log_letters
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget
from refold.processors.runtime.output_transactions import Outbox

__all__ = ["count_letters", "queue_letters"]

# Dead-letter reasons that mean the bytes did not decode.
_DECODE_REASONS = frozenset({"bad-magic", "unknown-fingerprint", "bad-body", "undecodable"})
# Reasons of a record dead-lettered for its event time: counted as late (``BatchOutcome.late``),
# not as rejected.
_LATENESS_REASONS = frozenset({"late", "expired"})


def count_letters(dead: list[DeadLetter], outcome: BatchOutcome) -> None:
    """Count a batch's dead letters in ``outcome``: undecodable, rejected, per reason.

    ``rejected`` counts the records refused by the fold's rules (and the envelope's, such as
    ``key-mismatch``) only: not the undecodable, not the late (their own counter), not a
    failing timer's letter (its record was applied).
    """
    outcome.undecodable = sum(d.reason in _DECODE_REASONS for d in dead)
    outcome.rejected = sum(
        not d.timer and d.reason not in _DECODE_REASONS | _LATENESS_REASONS for d in dead
    )
    outcome.dead_letters = dict(Counter(d.reason for d in dead))


def queue_letters(
    client: redis.Redis,
    target: FoldTarget,
    dead: list[DeadLetter],
    late_out: list[DeadLetter],
    batch_id: int | None,
    outcome: BatchOutcome,
    outbox: Outbox,
) -> LetterDecision:
    """Count the dead letters and queue them and the late side output in ``outbox``.

    Returns:
        The decision: its entries of the generation's dead-letter index, to be written with
        the positions, and its ledger entries, to be recorded once the outbox is committed.
        No generation queues a letter another sent already
        (:mod:`refold.processors.runtime.dead_letter_index`).
    """
    count_letters(dead, outcome)
    letters = [*dead, *late_out]
    if not letters:
        return LetterDecision()
    decision = decide_letters(client, target.layout, target.generation, letters)
    outcome.suppressed_letters = decision.suppressed
    chosen = set(decision.send)
    ranks = decision.ranks
    to_dlq = [(dead[i], ranks[i]) for i in range(len(dead)) if i in chosen]
    first_late = len(dead)
    to_late = [
        (late_out[i], ranks[first_late + i])
        for i in range(len(late_out))
        if first_late + i in chosen
    ]
    if to_dlq:
        _queue(target, to_dlq, batch_id, outbox)
    if to_late:
        _queue(target, to_late, batch_id, outbox, topic=target.late_topic)
    return decision


def _queue(
    target: FoldTarget,
    dead: Iterable[tuple[DeadLetter, int]],
    batch_id: int | None,
    outbox: Outbox,
    topic: str | None = None,
) -> None:
    """Queue records (with their ranks) with their reason and origin headers in ``outbox``."""
    topic = topic or target.dlq_topic
    ranked = list(dead)
    for letter, rank in ranked:
        value, key, headers = letter_message(letter, target.processor, target.generation, rank)
        outbox.add(letter.record[:3], topic, value, key, headers)
    log_letters(
        [letter for letter, _rank in ranked], topic, target.processor, target.generation, batch_id
    )
