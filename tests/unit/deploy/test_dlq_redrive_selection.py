"""Which dead letters ``refold dlq redrive`` selects (pure)."""

from __future__ import annotations

from refold.deploy.dlq_redrive import Letter, Selection


def _letter(topic: str = "orders", partition: int = 1, offset: int = 10, **kw) -> Letter:
    fields = {
        "reason": "rejected",
        "processor": "order_state",
        "generation": 1,
        "key": b"k",
        "value": b"v",
        "headers": [],
        "timer": False,
    }
    return Letter(topic, partition, offset, **{**fields, **kw})


def test_a_selection_takes_the_processor_s_letters_by_reason_and_origin():
    letter = _letter()
    assert letter.origin == "orders/1@10"
    assert Selection("order_state").matches(letter)
    assert not Selection("customer_stats").matches(letter)  # a shared topic: another's letter
    assert Selection("order_state", frozenset({"rejected", "bad-body"})).matches(letter)
    assert not Selection("order_state", frozenset({"bad-body"})).matches(letter)
    by_origin = Selection("order_state", topic="orders", partition=1, from_offset=10, to_offset=10)
    assert by_origin.matches(letter)  # both bounds inclusive
    assert not by_origin.matches(_letter(offset=11))
    assert not by_origin.matches(_letter(offset=9))
    assert not by_origin.matches(_letter(partition=0))
    assert not Selection("order_state", topic="payments").matches(letter)


def test_a_record_of_another_processor_s_output_is_derived():
    assert not _letter().derived
    assert _letter(headers=[("refold.origin.id", b"p|orders/0@1.0")]).derived
