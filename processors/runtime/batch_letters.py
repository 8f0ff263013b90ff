"""A fold batch's dead letters and late side output: counted, then queued in its outbox.

The letters go out in the batch's Kafka transaction
(:mod:`refold.processors.runtime.output_transactions`), before its Redis transaction. A
building generation does not queue the letters the live one sent already
(:mod:`refold.processors.runtime.dead_letter_index`).

Lifecycle: pure functions of a Redis client and a target; they run where the writer runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import redis

from refold.processors.runtime.dead_letter_index import decide_letters
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
) -> dict[str, str]:
    """Count the dead letters and queue them and the late side output in ``outbox``.

    Returns:
        The letters' entries of the generation's dead-letter index, to be written with
        the positions. A building generation does not queue the letters the live one sent
        already (:mod:`refold.processors.runtime.dead_letter_index`).
    """
    count_letters(dead, outcome)
    letters = [*dead, *late_out]
    if not letters:
        return {}
    decision = decide_letters(client, target.layout, target.generation, letters)
    outcome.suppressed_letters = decision.suppressed
    chosen = set(decision.send)
    to_dlq = [dead[i] for i in range(len(dead)) if i in chosen]
    to_late = [late_out[i] for i in range(len(late_out)) if i + len(dead) in chosen]
    if to_dlq:
        _queue(target, to_dlq, batch_id, outbox)
    if to_late:
        _queue(target, to_late, batch_id, outbox, topic=target.late_topic)
    return decision.entries


def _queue(
    target: FoldTarget,
    dead: Iterable[DeadLetter],
    batch_id: int | None,
    outbox: Outbox,
    topic: str | None = None,
) -> None:
    """Queue records with their reason and origin headers in ``outbox``."""
    topic = topic or target.dlq_topic
    letters = list(dead)
    for letter in letters:
        value, key, headers = letter_message(letter, target.processor, target.generation)
        outbox.add(letter.record[:3], topic, value, key, headers)
    log_letters(letters, topic, target.processor, target.generation, batch_id)
