"""What a processor sent, read back from Kafka headers and group names (pure parts)."""

from __future__ import annotations

from refold.contracts.origin import (
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_PROCESSOR,
    ORIGIN_TOPIC,
)
from refold.processors.runtime.dead_letters import LETTER_RANK
from refold.processors.runtime.output_transactions import marker_group
from refold.processors.runtime.sent_outputs import _group_pattern, letters_of


def _letter(offset: int, reason: str, generation: int, rank: int | None = None, **more: str):
    headers = {
        ORIGIN_TOPIC: "orders",
        ORIGIN_PARTITION: "1",
        ORIGIN_OFFSET: str(offset),
        DEAD_LETTER_REASON: reason,
        ORIGIN_PROCESSOR: "p",
        ORIGIN_GENERATION: str(generation),
        **more,
    }
    if rank is not None:
        headers[LETTER_RANK] = str(rank)
    return headers


def test_letters_read_back_are_the_ledger_fields_of_their_first_sender():
    entries = letters_of(
        "p",
        [
            _letter(5, "bad-body", 1, rank=0),
            _letter(5, "bad-body", 3, rank=0),  # sent again by g3 (the bug): g1 stays
            _letter(5, "rejected", 3, rank=0),  # a new reason: its own entry
            _letter(7, "timer", 2, rank=1),
            _letter(9, "bad-body", 1, **{ORIGIN_PROCESSOR: "other"}),  # not this processor's
            {ORIGIN_TOPIC: "orders"},  # no origin: no letter
        ],
    )
    assert entries == {
        "orders/1@5.0|bad-body": "1",
        "orders/1@5.0|rejected": "3",
        "orders/1@7.1|timer": "2",
    }


def test_letters_without_a_rank_take_their_place_among_their_generations():
    # Written before letters named their rank: a record's letters of one generation in order.
    entries = letters_of(
        "p",
        [_letter(5, "rejected", 1), _letter(5, "timer", 1), _letter(5, "rejected", 2)],
    )
    assert entries == {
        "orders/1@5.0|rejected": "1",
        "orders/1@5.1|timer": "1",
    }


def test_the_group_pattern_matches_every_generation_of_the_processor_and_no_other():
    pattern = _group_pattern("pre.fix", "order_state")
    assert pattern.fullmatch(marker_group("pre.fix", "order_state", 3, None, "1700000000000"))
    assert pattern.fullmatch(marker_group("pre.fix", "order_state", 12, None))
    assert not pattern.fullmatch(marker_group("pre.fix", "order_state", 3, 0, "17"))  # a slot
    assert not pattern.fullmatch(marker_group("pre.fix", "order_state.x", 3, None, "17"))
    assert not pattern.fullmatch(marker_group("prefix", "order_state", 3, None, "17"))
