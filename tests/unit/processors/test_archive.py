"""The archive's pure rules: Avro -> Arrow types, event dates, file names, the redundancy rule."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.processors import EventTime
from refold.contracts.registry import import_reference, processor_spec
from refold.processors.archive.config import ArchiveOptions
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import (
    META_COLUMNS,
    ArchiveProcessor,
    ArchiveSchemaError,
    ArchiveTable,
    Coverage,
    arrow_type,
    date_dir,
    day_of,
    is_archive_processor,
    overlapping,
    parse_date_dir,
    redundant,
)

UTC_MS = pa.timestamp("ms", tz="UTC")


def _record(*fields: dict) -> dict:
    return {"type": "record", "name": "Thing", "namespace": "t", "fields": list(fields)}


def test_every_avro_type_has_its_arrow_column():
    line = {
        "type": "record",
        "name": "Line",
        "fields": [
            {"name": "sku", "type": "string"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    cases = {
        "boolean": (pa.bool_(), False),
        "int": (pa.int32(), False),
        "long": (pa.int64(), False),
        "float": (pa.float32(), False),
        "double": (pa.float64(), False),
        "bytes": (pa.binary(), False),
        "string": (pa.string(), False),
        ("null", "string"): (pa.string(), True),
        ("string", "null"): (pa.string(), True),
    }
    for avro, expected in cases.items():
        schema = list(avro) if isinstance(avro, tuple) else avro
        assert arrow_type(schema) == expected, avro
    assert arrow_type({"type": "long", "logicalType": "timestamp-millis"}) == (UTC_MS, False)
    assert arrow_type({"type": "int", "logicalType": "date"}) == (pa.date32(), False)
    assert arrow_type({"type": "enum", "name": "E", "symbols": ["A"]}) == (pa.string(), False)
    assert arrow_type({"type": "fixed", "name": "F", "size": 4}) == (pa.binary(4), False)
    assert arrow_type({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}) == (
        pa.decimal128(9, 2),
        False,
    )
    listed, _ = arrow_type({"type": "array", "items": line})
    assert listed == pa.list_(
        pa.field(
            "element",
            pa.struct([pa.field("sku", pa.string(), False), pa.field("at", UTC_MS, False)]),
            False,
        )
    )
    mapped, _ = arrow_type({"type": "map", "values": ["null", "long"]})
    assert mapped == pa.map_(pa.string(), pa.field("value", pa.int64(), True))


def test_a_union_of_several_types_or_a_field_named_like_a_meta_column_is_refused():
    with pytest.raises(ArchiveSchemaError, match="union"):
        arrow_type(["null", "string", "long"])
    with pytest.raises(ArchiveSchemaError, match="kafka_offset"):
        ArchiveTable.of(_record({"name": "kafka_offset", "type": "long"}), None)


def test_every_reference_event_type_makes_a_table_with_the_meta_columns_last():
    codec = EventCodec()
    archive = import_reference(processor_spec("archive").projection)(ArchiveOptions(root=Path()))
    assert is_archive_processor(archive)
    assert len(archive.event_types) == 11
    for event_type in archive.event_types:
        table = archive.table(codec.reader_for(event_type).raw)
        assert table.schema.names[-len(META_COLUMNS) :] == [f.name for f in META_COLUMNS]
        # Every reference type is dated by its own event time, never the Kafka timestamp.
        assert table.time_field == DATES.field_of(event_type)
        assert table.schema.field(table.time_field).type == UTC_MS


def test_a_decoded_event_becomes_a_typed_row_that_round_trips_through_parquet():
    codec = EventCodec()
    placed = {
        "event_id": "e1",
        "order_id": "o1",
        "customer_id": "c1",
        "lines": [{"sku": "s", "qty": 2, "unit_price_minor": 150}],
        "currency": "EUR",
        "placed_at": 1_767_225_600_123,  # 2026-01-01T00:00:00.123Z
        "channel": "web",
        "coupon_code": None,
    }
    event = codec.decode(codec.encode("OrderPlaced", placed))
    table = ArchiveTable.of(codec.reader_for("OrderPlaced").raw, DATES)
    assert table.date_of(event.data, 0) == "2026-01-01"
    row = table.row(dict(event.data), ("commerce.orders", 3, 42, 1_767_225_601_000, b"o1"), 2)
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([row], schema=table.schema), out)
    back = pq.read_table(io.BytesIO(out.getvalue())).to_pylist()[0]
    assert back["placed_at"] == dt.datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=dt.UTC)
    assert back["lines"] == [{"sku": "s", "qty": 2, "unit_price_minor": 150}]
    assert back["coupon_code"] is None
    assert (back["kafka_topic"], back["kafka_partition"], back["kafka_offset"]) == (
        "commerce.orders",
        3,
        42,
    )
    assert back["kafka_key"] == b"o1"
    assert back["schema_version"] == 2


def test_decimals_are_converted_and_a_type_without_its_time_field_is_dated_by_kafka():
    schema = _record(
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        },
        {"name": "note", "type": "string"},
    )
    table = ArchiveTable.of(schema, EventTime(field="occurred_at"))
    assert table.time_field is None
    row = table.row(
        {"price": (12345).to_bytes(3, "big", signed=True), "note": "x"}, ("t", 0, 1, 0, None), 1
    )
    assert row["price"] == Decimal("123.45")
    assert row["kafka_timestamp"] is None  # 0: the broker gave none
    assert table.date_of(row, 86_400_000 * 3) == "1970-01-04"


def test_event_dates_are_utc_days_and_out_of_range_times_fall_back():
    assert day_of(0) == "1970-01-01"
    assert day_of(86_400_000 - 1) == "1970-01-01"
    assert day_of(-1) == "1969-12-31"
    assert day_of(None) is None
    assert day_of(True) is None
    assert day_of(10**18) is None  # past year 9999
    table = ArchiveTable.of(
        _record({"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}),
        EventTime(field="at"),
    )
    assert table.date_of({"at": 10**18}, 86_400_000) == "1970-01-02"


def test_file_names_parse_back_and_directories_are_hive_partitions():
    cov = Coverage("web.page-views_1", 7, 120, 4_500)
    assert cov.file_name == "web.page-views_1~p7~120-4500.parquet"
    assert Coverage.parse(cov.file_name) == cov
    for name in ("x.parquet", "t~p1~5-5.parquet", ".t~p1~0-5.parquet.ab12.tmp", "t~p1~9-5.parquet"):
        assert Coverage.parse(name) is None
    assert date_dir(Path("/a"), "OrderPaid", "2026-01-02") == Path(
        "/a/OrderPaid/event_date=2026-01-02"
    )
    assert parse_date_dir("event_date=2026-01-02") == "2026-01-02"
    assert parse_date_dir("event_date=26-1-2") is None


def test_the_redundancy_rule_removes_files_within_another_of_the_same_partition():
    big = Coverage("t", 0, 0, 300)
    inside = [Coverage("t", 0, 0, 100), Coverage("t", 0, 100, 200), Coverage("t", 0, 250, 300)]
    other_partition = Coverage("t", 1, 50, 60)
    beyond = Coverage("t", 0, 300, 400)
    straddling = Coverage("t", 0, 200, 350)
    files = [big, *inside, other_partition, beyond]
    assert redundant(files) == sorted(inside)
    assert redundant([big]) == []
    assert overlapping(files) == []
    assert overlapping([*files, straddling]) == [(big, straddling), (straddling, beyond)]


def test_an_archive_processor_is_told_apart_from_other_kinds():
    archive = ArchiveProcessor("a", Path("/x"), ("OrderPaid",))
    assert is_archive_processor(archive)
    assert not is_archive_processor(object())


def test_the_archive_command_explains_itself_and_refuses_bad_input(capsys, tmp_path, monkeypatch):
    from refold.deploy.cli import main as refold_main
    from refold.processors.runtime.archive.cli import build_parser, main

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in ("backfill", "compact", "status", "event_date=YYYY-MM-DD", "REFOLD_ARCHIVE__ROOT"):
        assert word in out
    with pytest.raises(SystemExit) as info:
        main(["backfill", "--from", "2026-13-01", "--to", "2026-01-02"])
    assert info.value.code == 2
    assert "expected a date YYYY-MM-DD" in capsys.readouterr().err
    # Passed on by `refold archive`; nothing archived yet is an error that says what to do.
    monkeypatch.setenv("REFOLD_ARCHIVE__ROOT", str(tmp_path / "archive"))
    assert refold_main(["archive", "status"]) == 1
    assert "nothing archived at" in capsys.readouterr().err
