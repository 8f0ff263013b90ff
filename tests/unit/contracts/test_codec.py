import pickle
from typing import Any

import avro.schema
import pytest

from refold.contracts.catalog import SchemaCatalog, default_catalog
from refold.contracts.codec import MAGIC, EventCodec, fingerprint_of
from refold.contracts.errors import DeserializationError, EventValidationError, UnknownSchemaError


def sample(schema: Any) -> Any:
    """A valid datum for any (parsed, named-types-inlined) Avro schema."""
    if isinstance(schema, list):
        return sample(next(s for s in schema if s != "null"))
    if isinstance(schema, str):
        return {
            "string": "x",
            "int": 3,
            "long": 1_700_000_000_000,
            "boolean": True,
            "double": 1.5,
            "float": 2.5,
            "bytes": b"b",
            "null": None,
        }[schema]
    kind = schema["type"]
    if kind == "record":
        return {f["name"]: sample(f["type"]) for f in schema["fields"]}
    if kind == "array":
        return [sample(schema["items"]), sample(schema["items"])]
    if kind == "enum":
        return schema["symbols"][-1]
    if kind == "map":
        return {"k": sample(schema["values"])}
    return sample(kind)


ALL_VERSIONS = list(default_catalog())


@pytest.mark.parametrize("version", ALL_VERSIONS, ids=lambda v: f"{v.name}.v{v.version}")
def test_every_schema_version_round_trips(version):
    codec = EventCodec(readers={version.name: version})
    datum = sample(version.raw)
    payload = (
        codec.encode(version.name, datum)
        if version is codec.catalog.latest(version.name)
        else _encode_with(version, datum)
    )
    assert payload[:2] == MAGIC
    assert payload[2:10] == version.fingerprint
    decoded = codec.decode(payload)
    assert decoded.event_type == version.name
    assert decoded.writer is version
    assert decoded.data == datum


def _encode_with(version, datum):
    from io import BytesIO

    import fastavro

    out = BytesIO()
    out.write(MAGIC + version.fingerprint)
    fastavro.schemaless_writer(out, version.parsed, datum)
    return out.getvalue()


def test_fingerprints_agree_with_apache_avro():
    from fastavro.schema import to_parsing_canonical_form

    # Apache Avro's own CRC-64-AVRO over the parsing canonical form, little-endian bytes as in
    # the single-object header. (avro's own canonical form keeps {"type":"long"} for logical
    # types, against the spec; fastavro's matches the Java SchemaNormalization.)
    assert avro.schema._crc_64_fingerprint(b'"int"').hex() == "8f5c393f1ad57572"
    for version in ALL_VERSIONS:
        canonical = to_parsing_canonical_form(version.raw).encode()
        assert version.fingerprint == avro.schema._crc_64_fingerprint(canonical)


def test_old_writer_resolves_to_new_reader_with_defaults():
    catalog = default_catalog()
    v1, v2 = catalog.versions("OrderPlaced")[:2]
    datum = sample(v1.raw)
    decoded = EventCodec().decode(_encode_with(v1, datum))
    assert decoded.writer is v1
    assert decoded.data == {**datum, "channel": "web", "coupon_code": None}
    assert EventCodec().reader_for("OrderPlaced") is v2


def test_garbage_is_not_decodable():
    with pytest.raises(DeserializationError) as info:
        EventCodec().decode(b'{"json": true}')
    assert info.value.reason == "bad-magic"
    assert info.value.raw == b'{"json": true}'
    with pytest.raises(DeserializationError):
        EventCodec().decode(None)


def test_unknown_fingerprint_is_reported_with_the_bytes():
    payload = MAGIC + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x00"
    with pytest.raises(UnknownSchemaError) as info:
        EventCodec().decode(payload)
    assert info.value.reason == "unknown-fingerprint"
    assert info.value.raw == payload
    assert "0102030405060708" in str(info.value)


def test_fingerprint_of_reads_the_header_only():
    codec = EventCodec()
    version = codec.catalog.latest("OrderPaid")
    payload = codec.encode("OrderPaid", sample(version.raw))
    assert fingerprint_of(payload) == version.fingerprint
    assert fingerprint_of(payload[:10]) == version.fingerprint  # header alone: body not read
    assert fingerprint_of(payload[:9]) is None  # shorter than the header
    assert fingerprint_of(MAGIC) is None
    assert fingerprint_of(b"") is None
    assert fingerprint_of(None) is None
    assert fingerprint_of(b'{"json": true, "more": 1}') is None
    assert fingerprint_of(b"\xc3\x02" + payload[2:]) is None  # another magic


def test_writer_of_names_the_writer_schema():
    codec = EventCodec()
    v1 = codec.catalog.versions("OrderPlaced")[0]
    payload = _encode_with(v1, sample(v1.raw))
    assert codec.writer_of(payload) is v1  # an old writer, not the reader it resolves to
    assert codec.writer_of(payload[:10]) is v1
    assert codec.decode(payload).writer is v1  # same cache as decode's
    copy = pickle.loads(pickle.dumps(codec))  # noqa: S301 - our own bytes (Spark ships it)
    assert copy.writer_of(payload) == v1


def test_writer_of_is_none_for_what_decode_refuses():
    codec = EventCodec()
    unknown = MAGIC + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x00"
    for value in (unknown, b'{"json": true}', MAGIC, None):
        assert codec.writer_of(value) is None
        with pytest.raises(DeserializationError):
            codec.decode(value)


def test_truncated_body_is_not_decodable():
    codec = EventCodec()
    latest = codec.catalog.latest("OrderPlaced")
    payload = codec.encode("OrderPlaced", sample(latest.raw))
    with pytest.raises(DeserializationError) as info:
        codec.decode(payload[:14])
    assert info.value.reason == "bad-body"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"order_id": 42}, "order_id"),
        ({"lines": [{"sku": "s", "qty": "two", "unit_price_minor": 1}]}, "qty"),
        ({"colour": "red"}, "colour"),
        ({"currency": None}, "currency"),
    ],
)
def test_invalid_event_names_the_field(change, field):
    codec = EventCodec()
    event = {**sample(codec.catalog.latest("OrderPlaced").raw), **change}
    with pytest.raises(EventValidationError) as info:
        codec.encode("OrderPlaced", event)
    assert field in str(info.value)
    assert info.value.event_type == "OrderPlaced"


def test_missing_field_is_named():
    codec = EventCodec()
    event = sample(codec.catalog.latest("OrderPaid").raw)
    del event["amount_minor"]
    with pytest.raises(EventValidationError, match="amount_minor"):
        codec.validate("OrderPaid", event)


def test_catalog_refuses_duplicate_schema(tmp_path):
    source = default_catalog().latest("OrderPaid").path
    (tmp_path / "OrderPaid.v1.avsc").write_text(source.read_text())
    (tmp_path / "OrderPaid.v2.avsc").write_text(source.read_text())
    with pytest.raises(Exception, match="same schema"):
        SchemaCatalog.from_directory(tmp_path)


def test_bytes_after_the_record_make_the_body_bad():
    from refold.contracts.errors import DeserializationError

    codec = EventCodec()
    event = {
        "event_id": "e",
        "order_id": "o",
        "reason": "customer",
        "cancelled_at": 1,
    }
    good = codec.encode("OrderCancelled", event)
    assert codec.decode(good).data == event
    with pytest.raises(DeserializationError) as caught:
        codec.decode(good + b"\x00")
    assert caught.value.reason == "bad-body"
