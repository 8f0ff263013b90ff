"""The one Avro type walker and its two emitters: Spark DDL (events DataFrame) and Arrow (archive).

The same schema, with every kind of Avro type, is walked into both; they must agree on what each
type is (a fixed decimal is a decimal in both) and convert a decoded value to the same Python
value. Decoding goes through the project's EventCodec (logical types off), as in production.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from refold.contracts.catalog import SchemaCatalog
from refold.contracts.codec import EventCodec
from refold.processors.fold.archive import ArchiveSchemaError, ArchiveTable, arrow_type
from refold.processors.fold.avro_types import convert
from refold.processors.fold.dataframe import (
    EventColumn,
    EventColumnsError,
    event_columns,
    event_row,
)

MONEY = {
    "type": "fixed",
    "name": "Money",
    "size": 8,
    "logicalType": "decimal",
    "precision": 18,
    "scale": 3,
}
KIND = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
ADDRESS = {
    "type": "record",
    "name": "Address",
    "namespace": "geo",
    "fields": [
        {"name": "street", "type": "string"},
        {"name": "zone", "type": ["null", "shop.Kind"]},  # an outer named type, by full name
    ],
}
LINE = {
    "type": "record",
    "name": "Line",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "price", "type": "Money"},  # the fixed decimal again, by its short name
        {"name": "qty", "type": ["null", "int"]},
    ],
}
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "flag", "type": "boolean"},
        {"name": "count", "type": "int"},
        {"name": "total", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "share", "type": "double"},
        {"name": "raw", "type": "bytes"},
        {"name": "kind", "type": KIND},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "price", "type": MONEY},
        {
            "name": "tax",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "tod_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tod_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "odd", "type": {"type": "string", "logicalType": "date"}},  # ignored: not int
        {"name": "address", "type": ADDRESS},
        {"name": "billing", "type": ["null", "geo.Address"]},  # reused by full name
        {"name": "shipping", "type": "geo.Address"},
        {"name": "lines", "type": {"type": "array", "items": LINE}},
        {"name": "tags", "type": {"type": "map", "values": ["null", "string"]}},
        {"name": "prices", "type": {"type": "map", "values": "Money"}},
        {"name": "refund", "type": ["shop.Money", "null"]},
    ],
}

ADDRESS_DDL = "STRUCT<`street`: STRING, `zone`: STRING>"
SPARK = {
    "id": "STRING",
    "flag": "BOOLEAN",
    "count": "INT",
    "total": "BIGINT",
    "ratio": "FLOAT",
    "share": "DOUBLE",
    "raw": "BINARY",
    "kind": "STRING",
    "digest": "BINARY",
    "price": "DECIMAL(18,3)",
    "tax": "DECIMAL(9,2)",
    "day": "DATE",
    "at": "TIMESTAMP",
    "at_us": "TIMESTAMP",
    "local": "TIMESTAMP_NTZ",
    "tod_ms": "INT",  # Spark has no time of day: the raw milliseconds after midnight
    "tod_us": "BIGINT",
    "uid": "STRING",
    "odd": "STRING",
    "address": ADDRESS_DDL,
    "billing": ADDRESS_DDL,
    "shipping": ADDRESS_DDL,
    "lines": "ARRAY<STRUCT<`sku`: STRING, `price`: DECIMAL(18,3), `qty`: INT>>",
    "tags": "MAP<STRING, STRING>",
    "prices": "MAP<STRING, DECIMAL(18,3)>",
    "refund": "DECIMAL(18,3)",
}

UTC_MS = pa.timestamp("ms", tz="UTC")
ARROW_ADDRESS = pa.struct([pa.field("street", pa.string(), False), pa.field("zone", pa.string())])
ARROW_MONEY = pa.decimal128(18, 3)
ARROW = {
    "id": (pa.string(), False),
    "flag": (pa.bool_(), False),
    "count": (pa.int32(), False),
    "total": (pa.int64(), False),
    "ratio": (pa.float32(), False),
    "share": (pa.float64(), False),
    "raw": (pa.binary(), False),
    "kind": (pa.string(), False),
    "digest": (pa.binary(4), False),
    "price": (ARROW_MONEY, False),
    "tax": (pa.decimal128(9, 2), False),
    "day": (pa.date32(), False),
    "at": (UTC_MS, False),
    "at_us": (pa.timestamp("us", tz="UTC"), False),
    "local": (pa.timestamp("ms"), False),
    "tod_ms": (pa.time32("ms"), False),
    "tod_us": (pa.time64("us"), False),
    "uid": (pa.string(), False),
    "odd": (pa.string(), False),
    "address": (ARROW_ADDRESS, False),
    "billing": (ARROW_ADDRESS, True),
    "shipping": (ARROW_ADDRESS, False),
    "lines": (
        pa.list_(
            pa.field(
                "element",
                pa.struct(
                    [
                        pa.field("sku", pa.string(), False),
                        pa.field("price", ARROW_MONEY, False),
                        pa.field("qty", pa.int32()),
                    ]
                ),
                False,
            )
        ),
        False,
    ),
    "tags": (pa.map_(pa.string(), pa.field("value", pa.string())), False),
    "prices": (pa.map_(pa.string(), pa.field("value", ARROW_MONEY, False)), False),
    "refund": (ARROW_MONEY, True),
}


def _money(text: str) -> bytes:
    """A Money value as the codec writes and decodes it: 8 big-endian two's-complement bytes."""
    return int(Decimal(text).scaleb(3)).to_bytes(8, "big", signed=True)


def _record(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Thing", "namespace": "t", "fields": list(fields)}


def test_every_kind_of_avro_type_is_walked_into_both_spark_and_arrow_columns():
    columns = {c.name: c.ddl for c in event_columns([ORDER])}
    assert {name: columns[name] for name in SPARK} == SPARK
    table = ArchiveTable.of(ORDER, None)
    for name, (kind, nullable) in ARROW.items():
        field = table.schema.field(name)
        assert (field.type, field.nullable) == (kind, nullable), name
    assert table.schema.names[: len(ARROW)] == list(ARROW)


def test_a_fixed_decimal_decodes_to_the_same_decimal_on_both_paths(tmp_path: Path):
    (tmp_path / "Order.v1.avsc").write_text(json.dumps(ORDER))
    codec = EventCodec(SchemaCatalog.from_directory(tmp_path))
    address = {"street": "Main", "zone": "B"}
    order = {
        "id": "o1",
        "flag": True,
        "count": 2,
        "total": 3,
        "ratio": 0.5,
        "share": 0.25,
        "raw": b"\x00",
        "kind": "A",
        "digest": b"abcd",
        "price": _money("-12.345"),
        "tax": (12345).to_bytes(3, "big", signed=True),
        "day": 1,
        "at": 1_000,
        "at_us": 7,
        "local": 2_000,
        "tod_ms": 3_723_000,
        "tod_us": 3_723_000_000,
        "uid": "u",
        "odd": "x",
        "address": address,
        "billing": None,
        "shipping": address,
        "lines": [{"sku": "s", "price": _money("1.5"), "qty": None}],
        "tags": {"a": None, "b": "x"},
        "prices": {"p": _money("0.001")},
        "refund": _money("99999.999"),
    }
    decoded = codec.decode(codec.encode("Order", order)).data
    assert decoded["price"] == _money("-12.345")  # logical types off: the raw fixed bytes

    row = event_row(event_columns([ORDER]), "Order", decoded, ("t", 0, 1))
    archived = ArchiveTable.of(ORDER, None).row(dict(decoded), ("t", 0, 1, 5, None), 1)
    for name in ("price", "lines", "prices", "refund", "tax"):
        assert row[name] == archived[name], name
    assert row["price"] == Decimal("-12.345")
    assert row["lines"] == [{"sku": "s", "price": Decimal("1.500"), "qty": None}]
    assert row["prices"] == {"p": Decimal("0.001")}
    assert row["refund"] == Decimal("99999.999")
    assert row["tax"] == Decimal("123.45")
    # Only Spark needs these: microseconds and dates. Arrow takes the numbers as they are.
    assert (row["at"], row["day"]) == (1_000_000, dt.date(1970, 1, 2))
    assert (archived["at"], archived["day"]) == (1_000, 1)
    assert row["tod_ms"] == archived["tod_ms"] == 3_723_000

    table = ArchiveTable.of(ORDER, None)
    back = pa.Table.from_pylist([archived], schema=table.schema).to_pylist()[0]
    assert back["price"] == Decimal("-12.345")
    assert back["tod_ms"] == dt.time(1, 2, 3)


def test_a_decimal_decoded_with_logical_types_on_is_passed_through():
    assert convert(Decimal("1.50"), ("decimal", 2)) == Decimal("1.50")
    assert convert([b"\x96"], ("array", ("decimal", 1))) == [Decimal("-10.6")]


def test_decimals_over_38_digits_are_refused_by_spark_and_widened_by_arrow():
    wide = {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}
    schema = _record({"name": "big", "type": {"type": "array", "items": wide}})
    with pytest.raises(EventColumnsError, match=r"Thing\.big\[\]: decimal\(40, 2\) is wider"):
        event_columns([schema])
    assert arrow_type(wide) == (pa.decimal256(40, 2), False)
    fixed = {**MONEY, "size": 17, "precision": 40}
    assert arrow_type(fixed) == (pa.decimal256(40, 3), False)


def test_the_null_type_is_an_arrow_null_column_and_refused_by_spark():
    assert arrow_type("null") == (pa.null(), True)
    assert arrow_type(["null"]) == (pa.null(), True)
    for null in ("null", ["null"]):
        with pytest.raises(EventColumnsError, match=r"Thing\.n: the null type"):
            event_columns([_record({"name": "n", "type": null})])


@pytest.mark.parametrize(
    ("avro", "message"),
    [
        (["null", "long", "string"], r"Thing\.f: the union .* several non-null types"),
        ({"type": "map", "values": ["long", "string"]}, r"Thing\.f\{\}: the union"),
        ("Nowhere", r"Thing\.f: type 'Nowhere' is not defined before its use"),
        (["null", ["null", "long"]], r"Thing\.f: a union directly inside a union"),
        (42, r"Thing\.f: unexpected Avro type 42"),
    ],
)
def test_types_no_column_can_hold_are_refused_alike_naming_the_field(avro: Any, message: str):
    schema = _record({"name": "f", "type": avro})
    with pytest.raises(EventColumnsError, match=message):
        event_columns([schema])
    with pytest.raises(ArchiveSchemaError, match=message):
        ArchiveTable.of(schema, None)


def test_a_named_type_is_found_by_its_short_or_its_full_name_in_later_fields():
    schema = _record(
        {"name": "a", "type": {"type": "fixed", "name": "Id", "namespace": "x", "size": 2}},
        {"name": "b", "type": "x.Id"},
        {"name": "c", "type": "Id"},
        {"name": "d", "type": {"type": "enum", "name": "E", "symbols": ["S"]}},
        {"name": "e", "type": "t.E"},  # defined in the record's namespace
    )
    columns = {c.name: c for c in event_columns([schema])}
    assert [columns[n].ddl for n in "abcde"] == ["BINARY"] * 3 + ["STRING"] * 2
    table = ArchiveTable.of(schema, None)
    assert [table.schema.field(n).type for n in "abc"] == [pa.binary(2)] * 3
    assert columns["b"] == EventColumn("b", "BINARY", None)
