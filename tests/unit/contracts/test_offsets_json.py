"""Kafka offsets in Spark's JSON form: one key order, strict and lenient reading."""

from __future__ import annotations

import pytest

from refold.contracts.kafka.offsets_json import nest, parse_offsets_json, to_offsets_json

POSITIONS = {("orders", 10): 7, ("clicks", 0): 1, ("orders", 2): 3, ("orders", 0): 0}


def test_one_key_order_topics_by_name_partitions_by_number():
    text = to_offsets_json(POSITIONS)
    assert text == '{"clicks": {"0": 1}, "orders": {"0": 0, "2": 3, "10": 7}}'
    assert to_offsets_json(dict(reversed(list(POSITIONS.items())))) == text  # equal -> equal
    assert list(nest(POSITIONS)["orders"]) == ["0", "2", "10"]


def test_a_round_trip_and_the_python_literal_pyspark_reports():
    assert parse_offsets_json(to_offsets_json(POSITIONS)) == POSITIONS
    literal = "{'orders': {'0': 5, '1': 6}}"  # PySpark 4.1's lastProgress for a Python source
    assert parse_offsets_json(literal, lenient=True) == {("orders", 0): 5, ("orders", 1): 6}


@pytest.mark.parametrize(
    "text", ["latest", "[1, 2]", '{"orders": 5}', '{"orders": {"0": "x"}}', "{'a': {'0': 1}}"]
)
def test_anything_else_is_an_error_or_nothing_when_lenient(text):
    with pytest.raises(ValueError, match=r"Kafka offsets|Expecting"):
        parse_offsets_json(text)
    if text != "{'a': {'0': 1}}":  # the literal form is read when lenient
        assert parse_offsets_json(text, lenient=True) == {}
