"""The headers every output carries: names and values pinned byte for byte (consumers read them)."""

from __future__ import annotations

import pytest

from refold.contracts.origin import (
    dead_letter_headers,
    decode_record_headers,
    encode_record_headers,
    failure_headers,
    origin_headers,
    origin_id,
    parse_origin_id,
    sender_headers,
)


def test_origin_headers_name_the_source_record_then_the_sender():
    assert origin_headers("orders", 2, 41, "order_state", 7) == [
        ("refold.origin.topic", b"orders"),
        ("refold.origin.partition", b"2"),
        ("refold.origin.offset", b"41"),
        ("refold.processor", b"order_state"),
        ("refold.generation", b"7"),
    ]
    assert origin_headers("orders", 2, 41, "order_state", 7)[3:] == sender_headers("order_state", 7)


def test_a_dead_letter_says_why_before_where_and_keeps_2000_bytes_of_error():
    detail = "é" * 1500  # 3000 bytes in UTF-8
    headers = dead_letter_headers("bad-body", detail, ("orders", 0, 5), "order_state", 1)
    assert headers[:1] == [("refold.reason", b"bad-body")]
    assert headers[1] == ("refold.error", detail.encode()[:2000])
    assert headers[2:] == origin_headers("orders", 0, 5, "order_state", 1)
    assert failure_headers("bad-body", detail) == headers[:2]


def test_an_origin_id_parses_back_to_its_stream_and_sequence():
    oid = origin_id("customer_stats", "orders", 3, 17, 2, slot=1)
    assert oid == "customer_stats#1|orders/3@17.2"
    parsed = parse_origin_id(oid.encode())
    assert parsed is not None
    assert (parsed.stream, parsed.seq) == ("customer_stats#1|orders/3", (17, 2))
    assert parse_origin_id("sales_windows|1m/0/abc/g") is None


def test_a_record_s_headers_round_trip_in_order_with_duplicates_and_nulls():
    headers = [("trace", b"t-1"), ("hop", b"a"), ("hop", b"\x00\xff"), ("x", None), ("s", "é")]
    encoded = encode_record_headers(headers)
    assert decode_record_headers(encoded) == [*headers[:4], ("s", "é".encode())]
    assert decode_record_headers(encode_record_headers([])) == []
    with pytest.raises(ValueError, match=r"refold\.headers"):
        decode_record_headers(b"not json")
