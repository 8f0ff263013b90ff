"""Dead letters: the record each becomes, and one log line per chunk (counts per reason)."""

import orjson

from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.dead_letters import DeadLetter, letter_message, summarise_letters


def _letter(offset: int, reason: str, detail: str) -> DeadLetter:
    return DeadLetter(SourceRecord("orders", 1, offset, b"k", b"v"), reason, detail)


def test_one_line_names_each_reason_its_count_and_its_first_origin():
    letters = [
        _letter(7, "rejected", "OrderShipped not allowed for a placed order"),
        _letter(9, "bad-body", "truncated"),
        _letter(12, "rejected", "another"),
    ]
    line = summarise_letters(letters, "order_state.dlq")
    assert line == (
        "3 record(s) to order_state.dlq: "
        "rejected x2 (first orders/1@7: OrderShipped not allowed for a placed order); "
        "bad-body x1 (first orders/1@9: truncated)"
    )
    assert "\n" not in line


def test_a_letter_is_its_record_with_why_and_where_and_a_timer_letter_says_so():
    value, key, headers = letter_message(_letter(7, "rejected", "not allowed"), "order_state", 3)
    found = dict(headers)
    assert (value, key) == (b"v", b"k")
    assert found["refold.reason"] == b"rejected"
    assert found["refold.processor"] == b"order_state"
    assert found["refold.generation"] == b"3"
    assert b"refold.timer" not in {k.encode() for k in found}
    timer = DeadLetter(SourceRecord("orders", 1, 8, b"k", b"v"), "timer-error", "boom", timer=True)
    value, key, headers = letter_message(timer, "order_state", 3)
    assert orjson.loads(value or b"") == {"timer": "boom"}  # the record itself was applied
    assert ("refold.timer", b"1") in headers
