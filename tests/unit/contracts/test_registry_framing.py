"""Registry framing in the codec (``00`` + 4-byte big-endian schema id + body): the pure logic.

The registry here is confluent-kafka's in-memory client (``mock://``) or a stand-in that fails;
the real registry (Apicurio) is in tests/integration/test_schema_registry.py.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from refold.contracts.catalog import default_catalog
from refold.contracts.codec import MAGIC, EventCodec, framing_of, writer_key
from refold.contracts.errors import DeserializationError
from refold.contracts.processors import ProcessLauncher
from refold.contracts.registry import ContractSet, Registry
from refold.contracts.schema_registry import (
    RegistrySchemas,
    SchemaNotRegisteredError,
    SchemaRegistrySettings,
    SchemaRegistryUnavailableError,
    schema_text,
    subject_of,
)
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.topics import TopicSpec
from refold.deploy.simulators.orders import OrderSimulator
from refold.replay.validate import FingerprintScan, decode_check

CATALOG = default_catalog()
PLACED = CATALOG.latest("OrderPlaced")
EVENT = next(e for t, e in OrderSimulator(3, seed=7) if t == "OrderPlaced")


def registry_with(*versions: Any, url: str) -> tuple[SchemaRegistrySettings, Any]:
    """Settings of an in-memory registry, and its client with ``versions`` registered."""
    settings = SchemaRegistrySettings(url=url)
    client = SchemaRegistryClient.new_client(settings.client_config())
    for version in versions:
        client.register_schema(subject_of(version), Schema(schema_text(version), "AVRO"))
    return settings, client


def codec_of(settings: SchemaRegistrySettings, client: Any) -> EventCodec:
    return EventCodec(CATALOG, registry=RegistrySchemas(settings, client))


def test_writer_key_and_framing_read_either_header():
    single = EventCodec(CATALOG, registry=SchemaRegistrySettings()).encode("OrderPlaced", EVENT)
    assert writer_key(single) == PLACED.fingerprint
    assert framing_of(single) == "single-object"
    framed = b"\x00\x00\x00\x01\x07" + single[10:]
    assert writer_key(framed) == b"\x00\x00\x00\x01\x07"
    assert framing_of(framed) == "registry"
    for garbage in (None, b"", b"\x00\x00\x01", b"{}", MAGIC + b"\x01"):
        assert writer_key(garbage) is None
        assert framing_of(garbage) is None


def test_registry_framing_round_trips_with_the_registered_id():
    settings, client = registry_with(PLACED, url="mock://framing-round-trip")
    schema_id = client.lookup_schema(subject_of(PLACED), Schema(schema_text(PLACED), "AVRO"))
    codec = codec_of(settings, client)
    payload = codec.encode("OrderPlaced", EVENT, framing="registry")
    assert payload[:5] == b"\x00" + schema_id.schema_id.to_bytes(4, "big")
    single = codec.encode("OrderPlaced", EVENT)
    assert payload[5:] == single[10:]  # the same Avro body
    decoded = codec.decode(payload)
    assert (decoded.event_type, decoded.writer, decoded.data) == ("OrderPlaced", PLACED, EVENT)
    assert codec.writer_of(payload) is PLACED
    assert codec.writer_for_key(payload[:5]) is PLACED
    # a fresh codec maps the id through the registry (get_schema), not through its own encode
    assert codec_of(settings, client).decode(payload).data == EVENT
    assert codec.encode_checked("OrderPlaced", EVENT, "registry") == payload


def test_an_unregistered_version_is_refused_saying_what_to_run():
    settings, client = registry_with(url="mock://framing-unregistered")
    with pytest.raises(SchemaNotRegisteredError) as caught:
        codec_of(settings, client).encode("OrderPlaced", EVENT, framing="registry")
    message = str(caught.value)
    assert f"OrderPlaced v{PLACED.version}" in message
    assert f"subject {PLACED.full_name}" in message
    assert "refold contracts publish" in message


def test_unknown_ids_and_foreign_schemas_are_dead_letter_reasons():
    foreign = '{"type":"record","name":"Foreign","namespace":"x","fields":[]}'
    settings, client = registry_with(url="mock://framing-unknown")
    foreign_id = client.register_schema("x.Foreign", Schema(foreign, "AVRO"))
    codec = codec_of(settings, client)
    with pytest.raises(DeserializationError) as caught:
        codec.decode(b"\x00\x00\x00\x03\xe7" + b"\x02")
    assert caught.value.reason == "unknown-schema-id"
    assert "has no schema id 999" in str(caught.value)
    assert caught.value.raw == b"\x00\x00\x00\x03\xe7\x02"
    with pytest.raises(DeserializationError) as caught:
        codec.decode(b"\x00" + foreign_id.to_bytes(4, "big"))
    assert caught.value.reason == "unknown-schema-id"
    assert "is no locked version of any contract" in str(caught.value)
    assert codec.writer_of(b"\x00\x00\x00\x03\xe7") is None


def test_without_a_registry_a_framed_record_names_the_setting():
    codec = EventCodec(CATALOG, registry=SchemaRegistrySettings())
    with pytest.raises(DeserializationError) as caught:
        codec.decode(b"\x00\x00\x00\x00\x01\x02")
    assert caught.value.reason == "no-schema-registry"
    assert "REFOLD_SCHEMA_REGISTRY__URL" in str(caught.value)


class _Flaky:
    """A registry client that fails ``failures`` times (as a refused connection), then answers."""

    def __init__(self, failures: int, answer: Any) -> None:
        self.failures, self.answer, self.calls = failures, answer, 0

    def get_schema(self, schema_id: int) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            msg = "connection refused"
            raise ConnectionError(msg)
        return self.answer


def test_an_outage_is_waited_out_and_never_skipped(monkeypatch, caplog):
    monkeypatch.setattr("refold.contracts.schema_registry._RETRY_PAUSE_S", (0.0,))
    answer = Schema(schema_text(PLACED), "AVRO")
    flaky = _Flaky(3, answer)
    schemas = RegistrySchemas(SchemaRegistrySettings(url="http://registry.invalid"), flaky)
    assert schemas.fingerprint_of_id(5) == PLACED.fingerprint
    assert flaky.calls == 4
    assert schemas.fingerprint_of_id(5) == PLACED.fingerprint  # cached
    assert flaky.calls == 4
    logged = [r.getMessage() for r in caplog.records]
    assert sum("does not answer" in line for line in logged) == 1  # the start, once
    assert sum("answers again" in line and "after 3 failed tries" in line for line in logged) == 1
    down = RegistrySchemas(
        SchemaRegistrySettings(url="http://registry.invalid", outage_wait_s=0), _Flaky(9, answer)
    )
    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        EventCodec(CATALOG, registry=down).decode(b"\x00\x00\x00\x00\x05\x02")
    assert "nothing was skipped" in str(caught.value)


def test_the_codec_pickles_without_its_client_and_reopens_it():
    settings, client = registry_with(PLACED, url="mock://framing-pickle")
    codec = codec_of(settings, client)
    payload = codec.encode("OrderPlaced", EVENT, framing="registry")
    copy = pickle.loads(pickle.dumps(codec))  # noqa: S301 - our own bytes
    assert copy.registry._client is None  # opened again where it runs
    assert copy.decode(payload).data == EVENT  # the cached id -> fingerprint travelled


def test_settings_pass_basic_auth_and_tls_through(monkeypatch):
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__URL", "https://registry:8081")
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO", "user:s3cr3t-pw")
    monkeypatch.setenv(
        "REFOLD_SCHEMA_REGISTRY__CLIENT_PROPERTIES", '{"ssl.ca.location": "/ca.pem"}'
    )
    settings = SchemaRegistrySettings.from_env()
    assert "s3cr3t-pw" not in repr(settings)
    assert settings.client_config() == {
        "url": "https://registry:8081",
        "ssl.ca.location": "/ca.pem",
        "basic.auth.user.info": "user:s3cr3t-pw",
    }


def test_a_topic_framing_is_its_own_else_its_contract_sets(tmp_path):
    mine = TopicSpec("a", 1, "id", ("A",), framing="registry")
    inherits = TopicSpec("b", 1, "id", ("B",))
    registry = Registry(
        [],
        [
            ContractSet("one", tmp_path, (mine, inherits), framing="single-object"),
            ContractSet("two", tmp_path, (TopicSpec("c", 1, "id", ("C",)),), framing="registry"),
        ],
    )
    assert [registry.framing(t) for t in ("a", "b", "c", "undeclared")] == [
        "registry",
        "single-object",
        "registry",
        "single-object",
    ]
    with pytest.raises(ValueError, match="framing must be one of single-object, registry"):
        TopicSpec("d", 1, "id", ("D",), framing="confluent")  # type: ignore[arg-type]


def test_the_replay_plan_s_decode_check_names_registry_ids():
    settings, client = registry_with(PLACED, url="mock://framing-decode-check")
    codec = codec_of(settings, client)
    framed = codec.encode("OrderPlaced", EVENT, framing="registry")
    counts = {framed[:5].hex(): 3, PLACED.fingerprint.hex(): 2, "00000003e7": 1}
    check = decode_check(FingerprintScan(counts, 6, 6), codec, accept_dead_letters=False)
    assert not check.ok
    assert f"all 6 records scanned; OrderPlaced v{PLACED.version}: 3" in check.detail
    assert f"OrderPlaced v{PLACED.version}: 2" in check.detail
    assert "unknown schema id 999 (unknown-schema-id) (1 records)" in check.detail


def test_a_processor_s_environment_carries_the_registry(monkeypatch, tmp_path):
    registry = SchemaRegistrySettings(
        url="https://registry:8081",
        basic_auth_user_info="u:pw",  # type: ignore[arg-type]
        client_properties={"ssl.ca.location": "/ca.pem"},
    )
    plain = ProcessLauncher(KafkaSettings(), RedisSettings(), SparkSettings(), tmp_path)
    assert not any(k.startswith("REFOLD_SCHEMA_REGISTRY") for k in plain.env())
    launcher = ProcessLauncher(
        KafkaSettings(), RedisSettings(), SparkSettings(), tmp_path, schema_registry=registry
    )
    for key, value in launcher.env().items():
        monkeypatch.setenv(key, value)
    assert SchemaRegistrySettings.from_env() == registry  # the child builds the same settings
