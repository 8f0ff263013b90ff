"""The dead-letter index's pure rules: fields, what a rebuild sends, the summary by reason."""

from __future__ import annotations

from dataclasses import dataclass

from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.dead_letter_index import (
    ReasonSummary,
    index_fields,
    letters_to_send,
    summarise_index,
)


@dataclass(frozen=True)
class Letter:
    record: SourceRecord
    reason: str
    detail: str = ""


def _letter(partition: int, offset: int, reason: str) -> Letter:
    return Letter(SourceRecord("orders", partition, offset, b"k", b"v"), reason)


def test_a_record_with_several_letters_gets_one_field_each() -> None:
    letters = [_letter(0, 7, "fold-error"), _letter(0, 7, "fold-error"), _letter(1, 7, "late")]
    assert index_fields(letters) == ["orders/0@7.0", "orders/0@7.1", "orders/1@7.0"]


def test_a_rebuild_sends_new_reasons_and_what_the_live_generation_has_not_applied() -> None:
    letters = [
        _letter(0, 3, "rejected"),  # live applied it and sent the same: not again
        _letter(0, 4, "rejected"),  # live applied it without a letter: new code, sent
        _letter(0, 5, "bad-body"),  # live sent another reason for it: sent
        _letter(0, 9, "rejected"),  # beyond live's position: sent (the cutover loses none)
        _letter(1, 0, "rejected"),  # a partition live has not applied at all: sent
    ]
    live_reasons = ["rejected", None, "bad-magic", None, None]
    sent = letters_to_send(letters, index_fields(letters), {"orders/0": 9}, live_reasons)
    assert sent == [1, 2, 3, 4]


def test_the_summary_counts_per_reason_and_names_the_first_origins_in_log_order() -> None:
    entries = {
        "orders/1@3.0": "rejected",
        "orders/0@12.0": "rejected",
        "orders/0@2.0": "rejected",
        "orders/0@2.1": "rejected",  # a second letter of the same record: one origin
        "web.views/0@5.0": "bad-magic",
    }
    assert summarise_index(entries, examples=2) == [
        ReasonSummary("rejected", 4, ("orders/0@2", "orders/0@12")),
        ReasonSummary("bad-magic", 1, ("web.views/0@5",)),
    ]
