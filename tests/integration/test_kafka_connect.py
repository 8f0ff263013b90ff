"""Kafka Connect, a client no one here wrote, sinks a refold output stream in registry framing.

order_state's change stream (``OrderStatusChanged``), on a topic a contract set declares
registry-framed, is written by its FoldWriter (the envelope Spark's tasks run, in-process).
A standalone Connect worker with Apicurio's AvroConverter (Confluent wire format: a 4-byte
content id) and Kafka's FileStreamSink writes each record as the converter decodes it; every
line must equal refold's own decode of that record, field for field.
"""

from __future__ import annotations

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.schema_registry import SchemaRegistrySettings
from refold.deploy import contracts_cli
from refold.processors.runtime.kafka_ranges import read_log
from tests.support.kafka_connect import StandaloneConnect, registry_converter
from tests.support.registry_outputs import registry_framed_changes

TIMESTAMP_CONVERTER = "org.apache.kafka.connect.transforms.TimestampConverter$Value"


@pytest.fixture
def registry_url(schema_registry, monkeypatch) -> str:
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__URL", schema_registry.url)
    return str(schema_registry.url)


def struct_line(fields: dict[str, object]) -> str:
    """What FileStreamSink writes for a Connect Struct: ``Struct{a=1,b=x}``, nulls left out."""
    return "Struct{" + ",".join(f"{k}={v}" for k, v in fields.items() if v is not None) + "}"


def test_kafka_connect_sinks_an_output_stream_in_registry_framing(
    registry_url, schema_registry, target, kafka_bootstrap, make_topic, monkeypatch, tmp_path
):
    assert contracts_cli.main(["publish"]) == 0
    changes, _events = registry_framed_changes(target, make_topic, monkeypatch, orders=60, seed=11)
    log = [m for chunk in read_log({"bootstrap.servers": kafka_bootstrap}, changes) for m in chunk]
    assert log
    assert {m.value()[:1] for m in log} == {b"\x00"}  # registry framing, every record
    refold = EventCodec(registry=SchemaRegistrySettings(url=registry_url))
    expected = sorted(struct_line(refold.decode(m.value()).data) for m in log)

    sink = tmp_path / "sink.txt"
    v2 = f"http://127.0.0.1:{schema_registry.port}/apis/registry/v2"
    connect = StandaloneConnect(
        tmp_path / "connect",
        kafka_bootstrap,
        {
            "name": "order-changes-to-file",
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
            "tasks.max": "1",
            "topics": changes,
            "file": str(sink),
            "consumer.override.auto.offset.reset": "earliest",
            **registry_converter(v2),
            # timestamp-millis arrives as a java.util.Date (printed to the second): back to
            # epoch milliseconds, as refold keeps it, with Connect's own transform.
            "transforms": "millis",
            "transforms.millis.type": TIMESTAMP_CONVERTER,
            "transforms.millis.field": "changed_at",
            "transforms.millis.target.type": "unix",
        },
    ).start()
    try:
        lines = connect.wait_for_lines(sink, len(log))
    finally:
        connect.stop()
    assert sorted(lines) == expected
