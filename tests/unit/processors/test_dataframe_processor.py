"""DataFrame processors, the pure parts: typed columns from Avro, rows, offsets log, checks."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.processors import EventTime
from refold.contracts.registry import import_reference, processor_spec
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.dataframe import (
    EventColumn,
    EventColumnsError,
    event_columns,
    event_row,
    events_ddl,
    is_dataframe_processor,
    output_mode_of,
)
from refold.processors.runtime import run_checks
from refold.processors.runtime.dataframe import refuse_lost_checkpoint
from refold.processors.sales_native.projection import SalesNative
from refold.processors.sales_windows.projection import SalesWindows

META = ["event_type", "topic", "partition", "offset"]


def _record(name: str, fields: list[dict], namespace: str = "t") -> dict:
    return {"type": "record", "name": name, "namespace": namespace, "fields": fields}


def test_order_paid_columns_are_typed_and_end_with_the_meta_columns():
    columns = event_columns([EventCodec().reader_for("OrderPaid").raw])
    types = {c.name: c.ddl for c in columns}
    assert [c.name for c in columns][-4:] == META
    assert types == {
        "event_id": "STRING",
        "order_id": "STRING",
        "amount_minor": "BIGINT",
        "currency": "STRING",
        "payment_method": "STRING",  # an enum
        "paid_at": "TIMESTAMP",  # timestamp-millis
        "event_type": "STRING",
        "topic": "STRING",
        "partition": "INT",
        "offset": "BIGINT",
    }


def test_several_types_share_their_common_fields_in_order_of_first_appearance():
    codec = EventCodec()
    columns = event_columns([codec.reader_for(t).raw for t in ("OrderPlaced", "OrderPaid")])
    names = [c.name for c in columns]
    assert names[:4] == ["event_id", "order_id", "customer_id", "lines"]
    assert names.count("currency") == names.count("order_id") == 1
    assert names.index("paid_at") > names.index("coupon_code")
    by_name = {c.name: c for c in columns}
    assert by_name["lines"].ddl == (
        "ARRAY<STRUCT<`sku`: STRING, `qty`: INT, `unit_price_minor`: BIGINT>>"
    )
    assert by_name["coupon_code"].ddl == "STRING"  # ["null", "string"]: nullable
    assert events_ddl(columns).startswith("`event_id` STRING, `order_id` STRING, ")


def test_a_field_of_two_types_a_meta_name_or_a_wide_union_is_refused():
    a = _record("A", [{"name": "x", "type": "long"}])
    b = _record("B", [{"name": "x", "type": "string"}])
    with pytest.raises(EventColumnsError, match="'x' is BIGINT in one event type and STRING"):
        event_columns([a, b])
    with pytest.raises(EventColumnsError, match="offset"):
        event_columns([_record("C", [{"name": "offset", "type": "long"}])])
    with pytest.raises(EventColumnsError, match="union"):
        event_columns([_record("D", [{"name": "u", "type": ["null", "long", "string"]}])])


def test_nested_logical_types_and_named_types_convert_to_what_arrow_takes():
    item = {
        "type": "record",
        "name": "Item",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        ],
    }
    price = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
    schema = _record(
        "Basket",
        [
            {"name": "items", "type": {"type": "array", "items": item}},
            {"name": "again", "type": ["null", "Item"]},  # a named type used twice
            {"name": "prices", "type": {"type": "map", "values": price}},
            {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        ],
    )
    columns = event_columns([schema])
    by_name = {c.name: c for c in columns}
    assert by_name["items"].ddl == "ARRAY<STRUCT<`at`: TIMESTAMP, `day`: DATE>>"
    assert by_name["again"].ddl == "STRUCT<`at`: TIMESTAMP, `day`: DATE>"
    assert by_name["prices"].ddl == "MAP<STRING, DECIMAL(9,2)>"
    assert by_name["seen"] == EventColumn("seen", "TIMESTAMP", None)
    event = {
        "items": [{"at": 1_000, "day": 1}],
        "again": None,
        "prices": {"a": (12345).to_bytes(3, "big", signed=True)},
        "seen": 7,
    }
    row = event_row(columns, "Basket", event, ("t", 3, 42))
    assert row == {
        "items": [{"at": 1_000_000, "day": dt.date(1970, 1, 2)}],
        "again": None,
        "prices": {"a": Decimal("123.45")},
        "seen": 7,
        "event_type": "Basket",
        "topic": "t",
        "partition": 3,
        "offset": 42,
    }


def test_a_row_has_every_column_and_milliseconds_become_microseconds():
    codec = EventCodec()
    columns = event_columns([codec.reader_for(t).raw for t in ("OrderPlaced", "OrderPaid")])
    paid = {
        "event_id": "e",
        "order_id": "o",
        "amount_minor": 5,
        "currency": "EUR",
        "payment_method": "CARD",
        "paid_at": 1_767_225_600_123,
    }
    row = event_row(columns, "OrderPaid", paid, ("orders", 0, 9))
    assert set(row) == {c.name for c in columns}
    assert row["paid_at"] == 1_767_225_600_123_000
    assert row["lines"] is None  # an OrderPlaced field
    assert (row["event_type"], row["offset"]) == ("OrderPaid", 9)


def test_the_kind_is_told_by_transform_and_the_output_mode_is_checked():
    assert is_dataframe_processor(SalesNative())
    assert not is_dataframe_processor(SalesWindows())
    assert output_mode_of(SalesNative()) == "update"

    class Complete(SalesNative):
        output_mode = "complete"

    with pytest.raises(EventColumnsError, match="update or append"):
        output_mode_of(Complete())


def test_sales_native_is_registered_and_builds_its_processor():
    spec = processor_spec("sales_native")
    built = import_reference(spec.projection)(None)
    assert isinstance(built, SalesNative)
    assert (built.name, built.table, spec.tables) == ("sales_native", "per_minute", ("per_minute",))


def test_a_generation_with_applied_batches_and_no_checkpoint_is_refused():
    refuse_lost_checkpoint("p", 2, has_checkpoint=True, batch_id=7)
    refuse_lost_checkpoint("p", 2, has_checkpoint=False, batch_id=None)  # nothing applied yet
    with pytest.raises(ProcessorConfigError, match="replay --processor p --to-earliest"):
        refuse_lost_checkpoint("p", 2, has_checkpoint=False, batch_id=7)


def test_a_dataframe_processor_with_an_event_time_in_its_spec_is_refused():
    run_checks.check_event_time(SalesNative(), None, None)
    with pytest.raises(ProcessorConfigError, match="withWatermark"):
        run_checks.check_event_time(SalesNative(), EventTime(field="paid_at"), None)
