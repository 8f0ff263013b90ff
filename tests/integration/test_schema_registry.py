"""The schema registry for real: Apicurio (started as `refold up --schema-registry` starts it),
`refold contracts publish`, both gates on a schema change, the producer SDK in registry framing
read back by a plain confluent-kafka consumer with its own AvroDeserializer."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from refold.contracts.catalog import SchemaCatalog, default_catalog
from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.errors import SchemaIncompatibleError
from refold.contracts.lock import PublishGate, relock
from refold.contracts.registry import ContractSet, Registry
from refold.contracts.schema_registry import (
    SchemaNotRegisteredError,
    SchemaRegistrySettings,
    fingerprint_of_text,
)
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.deploy import cli, contracts_cli, tail_cli
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.producer.publisher import EventPublisher
from tests.support.chain import status_changes
from tests.support.registry_outputs import registry_framed_changes

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CODEC = EventCodec(registry=SchemaRegistrySettings())  # single-object: what refold's SDK writes

V1 = [{"name": "id", "type": "string"}, {"name": "n", "type": "long"}]
V2 = [*V1, {"name": "note", "type": "string", "default": ""}]  # BACKWARD_TRANSITIVE
V3 = [*V2, {"name": "weight", "type": "double"}]  # no default: v3 cannot read v1, v2


def write_version(folder: Path, namespace: str, version: int, fields: list[Any]) -> None:
    schema = {"type": "record", "name": "Thing", "namespace": namespace, "fields": fields}
    (folder / f"Thing.v{version}.avsc").write_text(json.dumps(schema))


def thing_set(tmp_path: Path, unique: str, topic: str = "things") -> ContractSet:
    """A contract set of one record, ``refold.t<unique>.Thing`` (a subject of this test only)."""
    folder = tmp_path / "schemas"
    folder.mkdir()
    write_version(folder, f"refold.t{unique}", 1, V1)
    contracts = ContractSet("things", folder, (TopicSpec(topic, 1, "id", ("Thing",)),))
    lock(contracts)
    return contracts


def lock(contracts: ContractSet) -> None:
    text, _ = relock(contracts)
    contracts.lock_path.write_text(text)


@pytest.fixture
def registry_url(schema_registry, monkeypatch) -> str:
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__URL", schema_registry.url)
    return str(schema_registry.url)


def test_refold_status_shows_the_registry(schema_registry, capsys):
    state_dir = schema_registry.state_dir.parent
    code = cli.main(["status", "--state-dir", str(state_dir)])
    out = capsys.readouterr().out
    status = schema_registry.status()
    assert f"schema-registry port {status.port:<6} running (pid {status.pid})" in out
    assert f"Apicurio Registry, http://127.0.0.1:{status.port}/apis/ccompat/v7" in out
    assert code == 6  # the registry runs; this state dir's Kafka and Redis do not


def test_publish_registers_every_locked_version_backward_transitive(registry_url, capsys):
    assert contracts_cli.main(["publish"]) == 0
    client = SchemaRegistryClient({"url": registry_url})
    catalog = default_catalog()
    for name in catalog.names():
        versions = catalog.versions(name)  # every shipped version is locked
        subject = versions[0].full_name
        registered = [
            fingerprint_of_text(client.get_version(subject, n).schema.schema_str)
            for n in client.get_versions(subject)
        ]
        assert registered == [v.fingerprint for v in versions], subject
        assert client.get_compatibility(subject) == "BACKWARD_TRANSITIVE"
    capsys.readouterr()
    assert contracts_cli.main(["publish"]) == 0  # again: it agrees, nothing new
    out = capsys.readouterr().out
    assert "registered" not in out
    assert f"agrees with the lock ({len(catalog.names())} subjects)" in out


def test_schema_ids_survive_a_restart_of_the_registry(schema_registry, unique):
    """Stopped and started as `refold down` / `refold up` do: its H2 file keeps every id."""
    subject = f"refold.t{unique}.Kept"
    kept = {"type": "record", "name": "Kept", "namespace": f"refold.t{unique}", "fields": V1}
    schema_id = SchemaRegistryClient({"url": schema_registry.url}).register_schema(
        subject, Schema(json.dumps(kept), "AVRO")
    )
    before = schema_registry.status().pid
    schema_registry.stop()
    assert not schema_registry.status().running
    schema_registry.start()
    assert schema_registry.status().pid != before
    assert (schema_registry.data_dir / "registry.mv.db").is_file()
    client = SchemaRegistryClient({"url": schema_registry.url})  # a new client: no cache
    assert fingerprint_of_text(client.get_schema(schema_id).schema_str) == fingerprint_of_text(
        json.dumps(kept)
    )
    assert client.get_versions(subject) == [1]
    later = {**kept, "fields": V2}  # a version registered after the restart: a new id
    assert client.register_schema(subject, Schema(json.dumps(later), "AVRO")) != schema_id
    assert client.get_versions(subject) == [1, 2]


def test_a_version_that_differs_in_the_registry_is_refused(registry_url, tmp_path, unique, capsys):
    contracts = thing_set(tmp_path, unique)
    subject = f"refold.t{unique}.Thing"
    client = SchemaRegistryClient({"url": registry_url})
    other = {"type": "record", "name": "Thing", "namespace": f"refold.t{unique}", "fields": V1[:1]}
    client.register_schema(subject, Schema(json.dumps(other), "AVRO"))
    code = contracts_cli.main(["publish"], registry=Registry([], [contracts]))
    err = capsys.readouterr().err
    mine = SchemaCatalog.from_directory(contracts.schemas).latest("Thing")
    theirs = fingerprint_of_text(json.dumps(other)).hex()
    assert code == 1
    assert (
        f"{subject}: the registry's version 1 has fingerprint {theirs}, the lock's Thing v1 "
        f"has {mine.fingerprint_hex}"
    ) in err
    assert client.get_versions(subject) == [1]  # left as it was


def test_a_schema_change_goes_through_both_gates(registry_url, tmp_path, unique, capsys):
    contracts = thing_set(tmp_path, unique)
    subject = f"refold.t{unique}.Thing"
    registry = Registry([], [contracts])
    assert contracts_cli.main(["publish"], registry=registry) == 0
    write_version(contracts.schemas, f"refold.t{unique}", 2, V2)  # compatible: both accept
    lock(contracts)
    assert contracts_cli.main(["publish"], registry=registry) == 0
    assert "registered v2 (id " in capsys.readouterr().out
    client = SchemaRegistryClient({"url": registry_url})
    assert client.get_versions(subject) == [1, 2]
    write_version(contracts.schemas, f"refold.t{unique}", 3, V3)  # incompatible: both refuse
    with pytest.raises(SchemaIncompatibleError, match="weight"):
        lock(contracts)
    v3 = {"type": "record", "name": "Thing", "namespace": f"refold.t{unique}", "fields": V3}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(v3), "AVRO"))
    assert refused.value.http_status_code == 409
    assert "weight at /fields/3" in str(refused.value)
    assert client.get_versions(subject) == [1, 2]


def test_the_sdk_writes_registry_framing_a_plain_avro_deserializer_reads(
    registry_url, kafka_bootstrap, make_topic, tmp_path, unique
):
    topic = make_topic(partitions=1, prefix="things")
    contracts = thing_set(tmp_path, unique, topic)
    catalog = SchemaCatalog.from_directory(contracts.schemas)
    spec = TopicSpec(topic, 1, "id", ("Thing",), framing="registry")
    settings = SchemaRegistrySettings(url=registry_url)
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap),
        EventCodec(catalog, registry=settings),
        [spec],
        gate=PublishGate.for_contract_sets([contracts]),
    )
    events = [{"id": f"t-{i}", "n": i * 7} for i in range(5)]
    with pytest.raises(SchemaNotRegisteredError) as caught:
        publisher.emit("Thing", events[0])
    assert (
        f"Thing v1 (fingerprint {catalog.latest('Thing').fingerprint_hex}) is not registered in "
        f"the schema registry at {registry_url} (subject refold.t{unique}.Thing); nothing was "
        "sent. Operator action: run `refold contracts publish` with REFOLD_SCHEMA_REGISTRY__URL "
        "set."
    ) in str(caught.value)
    assert contracts_cli.main(["publish"], registry=Registry([], [contracts])) == 0
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap),
        EventCodec(catalog, registry=settings),
        [spec],
        gate=PublishGate.for_contract_sets([contracts]),
    )
    publisher.emit_many([("Thing", e) for e in events])
    # A consumer that knows nothing of refold: confluent-kafka's own AvroDeserializer.
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": unique, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[dict[str, Any]] = []
    for _ in range(40):
        for message in consumer.consume(10, timeout=0.5):
            assert message.value()[:1] == b"\x00"
            context = SerializationContext(topic, MessageField.VALUE)
            read.append(deserializer(message.value(), context))
        if len(read) >= len(events):
            break
    consumer.close()
    assert read == events


def test_refold_tail_decodes_registry_framing(
    registry_url, kafka_bootstrap, make_topic, monkeypatch, capsys
):
    assert contracts_cli.main(["publish"]) == 0  # the installed contracts (again: idempotent)
    topic = make_topic(partitions=1, prefix="orders")
    spec = TopicSpec(topic, 1, "order_id", ORDERS.event_types, framing="registry")
    events = list(OrderSimulator(3, seed=5))
    EventPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=[spec]).emit_many(
        events
    )
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    capsys.readouterr()
    assert tail_cli.main([topic, "--from", "earliest", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["event_type"], r["value"]) for r in shown] == events


def test_an_output_stream_in_registry_framing_is_read_by_a_plain_avro_deserializer(
    registry_url, target, kafka_bootstrap, make_topic, monkeypatch, unique
):
    """order_state's change stream, declared registry-framed by a contract set, read by a
    consumer that knows nothing of refold (its FoldWriter: the envelope Spark's tasks run)."""
    assert contracts_cli.main(["publish"]) == 0
    changes, events = registry_framed_changes(target, make_topic, monkeypatch, orders=120, seed=47)
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(changes, MessageField.VALUE)
    log = [m for chunk in read_log({"bootstrap.servers": kafka_bootstrap}, changes) for m in chunk]
    assert {m.value()[:1] for m in log} == {b"\x00"}
    read = [deserializer(m.value(), context) for m in log]
    assert Counter((r["customer_id"], r["status"]) for r in read) == status_changes(events)
    refold = EventCodec(registry=SchemaRegistrySettings(url=registry_url))
    millis = timedelta(milliseconds=1)  # AvroDeserializer: a datetime; refold: epoch millis
    assert [{**r, "changed_at": (r["changed_at"] - EPOCH) // millis} for r in read] == [
        refold.decode(m.value()).data for m in log
    ]
