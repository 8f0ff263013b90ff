"""Dead letters are logged as one line per chunk: counts per reason with the first origin."""

from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.dead_letter_log import summarise_letters
from refold.processors.runtime.envelope import _DeadLetter


def _letter(offset: int, reason: str, detail: str) -> _DeadLetter:
    return _DeadLetter(SourceRecord("orders", 1, offset, b"k", b"v"), reason, detail)


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
