"""Property tests of the codec: no payload makes decode raise anything but DeserializationError.

Derandomized (the same examples every run) and without an example database, so CI is
deterministic and the run leaves no ``.hypothesis`` directory behind.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st

from refold.contracts.catalog import default_catalog
from refold.contracts.codec import MAGIC, DecodedEvent, EventCodec
from refold.contracts.errors import DeserializationError, EventValidationError
from refold.contracts.schema_registry import SchemaRegistrySettings
from refold.deploy.simulators.orders import OrderSimulator

# A registry-framed prefix (00 + 4 bytes) asks confluent-kafka's in-memory registry: no such id.
CODEC = EventCodec(registry=SchemaRegistrySettings(url="mock://codec-fuzz"))
CATALOG = default_catalog()
FINGERPRINTS = sorted(v.fingerprint for v in CATALOG)
DECODE_REASONS = {"bad-magic", "unknown-fingerprint", "unknown-schema-id", "bad-body"}
# A few hundred examples per property keep the whole file at a few seconds.
FUZZ = settings(max_examples=300, derandomize=True, database=None, deadline=None)

# Anomalies included: they are valid encodings the fold must reject, not bad bytes.
EVENTS = list(OrderSimulator(120, seed=11, anomaly_rate=0.2, concurrency=8))
ENCODED = [CODEC.encode(event_type, event) for event_type, event in EVENTS]
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def decode_or_error(payload: bytes | None) -> DecodedEvent | DeserializationError:
    """Decode; a DeserializationError is returned after checking it, anything else propagates."""
    try:
        return CODEC.decode(payload)
    except DeserializationError as exc:
        error = exc
    assert error.reason in DECODE_REASONS, error.reason
    assert error.raw == payload
    assert str(error)
    return error


def varint(value: int) -> bytes:
    """Avro's zig-zag varint of a signed 64-bit ``value``."""
    n = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string(text: str) -> bytes:
    raw = text.encode()
    return varint(len(raw)) + raw


def header(event_type: str) -> bytes:
    return MAGIC + CATALOG.latest(event_type).fingerprint


def datum(schema: Any) -> st.SearchStrategy[Any]:
    """Valid data for one of the shipped (self-contained, named types inline) schemas."""
    if isinstance(schema, list):
        return st.one_of(*(datum(branch) for branch in schema))
    if isinstance(schema, str):
        return {
            "null": st.none(),
            "string": st.text(max_size=12),
            "int": INT32,
            "long": INT64,
            "double": st.floats(allow_nan=False),
            "float": st.floats(allow_nan=False, width=32),
            "boolean": st.booleans(),
        }[schema]
    kind = schema["type"]
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: datum(f["type"]) for f in schema["fields"]})
    if kind == "array":
        return st.lists(datum(schema["items"]), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), datum(schema["values"]), max_size=3)
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    return datum(kind)  # {"type": "long", "logicalType": ...}


VALID_EVENTS = st.sampled_from(CATALOG.names()).flatmap(
    lambda name: st.tuples(st.just(name), datum(CATALOG.latest(name).raw))
)


@st.composite
def encodings(draw: st.DrawFn) -> bytes:
    """A valid encoding: of a simulator event, or of random valid field values."""
    if draw(st.booleans()):
        return draw(st.sampled_from(ENCODED))
    event_type, event = draw(VALID_EVENTS)
    return CODEC.encode(event_type, event)


@FUZZ
@given(st.binary(max_size=300))
@example(b"")
@example(MAGIC)
@example(MAGIC + FINGERPRINTS[0])
def test_arbitrary_bytes_decode_or_raise_deserialization_error(payload):
    decode_or_error(payload)


@FUZZ
@given(st.sampled_from(FINGERPRINTS), st.binary(max_size=200))
def test_arbitrary_body_behind_a_known_fingerprint(fingerprint, body):
    result = decode_or_error(MAGIC + fingerprint + body)
    if isinstance(result, DecodedEvent):
        assert result.writer.fingerprint == fingerprint
        assert isinstance(result.data, dict)


def test_none_and_empty_are_bad_magic():
    for payload in (None, b""):
        with pytest.raises(DeserializationError) as caught:
            CODEC.decode(payload)
        assert caught.value.reason == "bad-magic"
        assert caught.value.raw == payload


@settings(max_examples=20, derandomize=True, database=None, deadline=None)
@given(st.integers(0, 2**31))
@example(7)
def test_every_simulator_event_round_trips(seed):
    for event_type, event in OrderSimulator(25, seed=seed, anomaly_rate=0.2, concurrency=6):
        decoded = CODEC.decode(CODEC.encode(event_type, event))
        assert (decoded.event_type, decoded.data) == (event_type, event)


@FUZZ
@given(VALID_EVENTS)
def test_every_valid_event_round_trips(event_type_and_event):
    event_type, event = event_type_and_event
    decoded = CODEC.decode(CODEC.encode(event_type, event))
    assert (decoded.event_type, decoded.data) == (event_type, event)


@FUZZ
@given(encodings(), st.data())
def test_truncated_encodings_never_decode(payload, data):
    cut = data.draw(st.integers(0, len(payload) - 1))
    result = decode_or_error(payload[:cut])
    # Every byte of a record is needed to decode it: a strict prefix never decodes.
    assert isinstance(result, DeserializationError)


@FUZZ
@given(encodings(), st.lists(st.integers(0, 2**16), min_size=1, max_size=6))
def test_bit_flipped_encodings_decode_or_raise_deserialization_error(payload, flips):
    mutated = bytearray(payload)
    for flip in flips:
        mutated[flip // 8 % len(mutated)] ^= 1 << (flip % 8)
    result = decode_or_error(bytes(mutated))
    if isinstance(result, DecodedEvent):
        assert result.event_type in CATALOG.names()


@FUZZ
@given(encodings(), st.binary(min_size=1, max_size=64))
def test_extended_encodings_decode_the_record_or_raise_deserialization_error(payload, tail):
    result = decode_or_error(payload + tail)
    if isinstance(result, DecodedEvent):  # today trailing bytes are not read
        assert result.data == CODEC.decode(payload).data


@FUZZ
@given(encodings(), st.binary(min_size=8, max_size=8))
def test_an_unknown_fingerprint_is_named_as_such(payload, fingerprint):
    result = decode_or_error(payload[:2] + fingerprint + payload[10:])
    if fingerprint not in FINGERPRINTS:
        assert isinstance(result, DeserializationError)
        assert result.reason == "unknown-fingerprint"


@FUZZ
@given(encodings(), st.sampled_from(FINGERPRINTS))
def test_another_known_fingerprint_decodes_or_raises_deserialization_error(payload, fingerprint):
    result = decode_or_error(payload[:2] + fingerprint + payload[10:])
    if isinstance(result, DecodedEvent):
        assert result.writer.fingerprint == fingerprint


@FUZZ
@given(encodings(), st.data(), INT64, st.binary(max_size=16))
def test_a_spliced_length_or_count_decodes_or_raises_deserialization_error(
    payload, data, value, tail
):
    # Any varint where the body has a string length, array count, enum or union index.
    at = data.draw(st.integers(10, len(payload)))
    decode_or_error(payload[:at] + varint(value) + tail)


HOSTILE = {
    "string length 2**62": header("OrderCancelled") + varint(2**62),
    "string length 2**63-1": header("OrderCancelled") + varint(2**63 - 1) + b"abc",
    "negative string length": header("OrderCancelled") + varint(-5) + b"abcdefgh",
    "string length -2**63": header("OrderCancelled") + varint(-(2**63)) + b"abcdefgh",
    "array count 2**62": header("OrderPlaced") + string("e") * 3 + varint(2**62),
    "array count 2**62, 3 items": (
        header("OrderPlaced")
        + string("e") * 3
        + varint(2**62)
        + (string("sku") + varint(1) + varint(1)) * 3
    ),
    "array count -2**62 and block size 2**62": (
        header("OrderPlaced") + string("e") * 3 + varint(-(2**62)) + varint(2**62)
    ),
    "overlong varint": header("OrderCancelled") + b"\xff" * 50 + b"\x00" + b"x" * 10,
    "invalid utf-8": header("OrderCancelled") + varint(2) + b"\xff\xfe" + string("o") * 2,
    "union index 7": (
        header("OrderPlaced")
        + string("e") * 3
        + varint(0)
        + string("EUR")
        + varint(1)
        + string("web")
        + varint(7)
    ),
    "enum index 9": header("OrderPaid") + string("e") * 2 + varint(1) + string("EUR") + varint(9),
}


@pytest.mark.parametrize("payload", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_lengths_and_indexes_fail_fast_without_allocating(payload):
    tracemalloc.start()
    try:
        with pytest.raises(DeserializationError) as caught:
            CODEC.decode(payload)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "bad-body"
    assert peak < 1 << 20, f"decoding {len(payload)} bytes allocated {peak} bytes"


@given(VALID_EVENTS)
def test_the_writer_checked_encoding_equals_the_validated_one(typed_event) -> None:
    event_type, event = typed_event
    assert CODEC.encode_checked(event_type, event) == CODEC.encode(event_type, event)


@given(VALID_EVENTS, st.sampled_from(["drop", "extra", "retype"]))
def test_the_writer_checked_encoding_refuses_what_validation_refuses(typed_event, how) -> None:
    event_type, event = typed_event
    broken = dict(event)
    if how == "extra":
        broken["not_a_field"] = 1
    else:
        name = sorted(broken)[0]
        if how == "drop":
            del broken[name]
        else:
            broken[name] = object()
    try:
        CODEC.validate(event_type, broken)
    except EventValidationError:
        with pytest.raises(EventValidationError):
            CODEC.encode_checked(event_type, broken)
    else:
        assert CODEC.encode_checked(event_type, broken) == CODEC.encode(event_type, broken)
