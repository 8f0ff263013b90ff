"""A batch's dead letters, counted as the docs define them (docs/reliability.md)."""

from __future__ import annotations

from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.batch_letters import count_letters
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.fold_target import BatchOutcome


def _letter(offset: int, reason: str, *, timer: bool = False) -> DeadLetter:
    return DeadLetter(SourceRecord("orders", 0, offset, b"k", b"v"), reason, "why", timer)


def test_rejected_counts_only_what_the_rules_refused_not_the_late_nor_the_undecodable() -> None:
    # A batch's log line once said "8 rejected, ... 8 late" for 8 late records and no refusal.
    dead = [_letter(i, "late") for i in range(8)]
    dead += [_letter(8, "expired"), _letter(9, "bad-body"), _letter(10, "timer-error", timer=True)]
    dead += [_letter(11, "rejected"), _letter(12, "key-mismatch")]
    outcome = BatchOutcome()
    count_letters(dead, outcome)
    assert (outcome.rejected, outcome.undecodable) == (2, 1)
    assert outcome.dead_letters == {
        "late": 8,
        "expired": 1,
        "bad-body": 1,
        "timer-error": 1,
        "rejected": 1,
        "key-mismatch": 1,
    }
