"""`refold tail`: any topic's records, decoded from Avro, with headers; --from, --limit, --json."""

from __future__ import annotations

import dataclasses
import json
import time

from confluent_kafka import Producer

from refold.contracts.commerce import ORDERS
from refold.contracts.origin import dead_letter_headers
from refold.contracts.settings import KafkaSettings
from refold.deploy.simulators.orders import OrderSimulator
from refold.deploy.tail_cli import main as tail
from refold.services.producer.publisher import EventPublisher


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_tail_decodes_events_and_shows_dead_letters_with_their_headers(
    kafka_bootstrap, make_topic, monkeypatch, capsys
):
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    orders = make_topic(partitions=2, prefix="orders")
    events = list(OrderSimulator(5, seed=3, anomaly_rate=0))
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    publisher.emit_many(events)
    publisher.close()

    assert tail([orders, "--from", "earliest", "--json"]) == 0
    shown = _lines(capsys)
    assert len(shown) == len(events)
    assert sorted((r["event_type"], r["value"]["event_id"]) for r in shown) == sorted(
        (t, e["event_id"]) for t, e in events
    )
    assert all(r["key"] == r["value"]["order_id"] for r in shown)

    assert tail([orders, "--from", "-1", "--json"]) == 0  # the last record of each partition
    last = _lines(capsys)
    assert len(last) == 2
    assert tail([orders, "--from", "earliest", "--limit", "3", "--json"]) == 0
    assert len(_lines(capsys)) == 3

    dlq = make_topic(partitions=1, prefix="dlq")
    producer = Producer(kafka.as_librdkafka())
    headers = dead_letter_headers("bad-body", "truncated body", (orders, 1, 7), "order_state", 2)
    producer.produce(dlq, b"\xc3\x01junk", b"ord-1", headers=headers)
    producer.flush(10)
    assert tail([dlq, "--from", "earliest"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{dlq}/0@0 ")
    assert "(not Avro)" in line
    assert "refold.reason=bad-body" in line
    assert f"refold.origin.topic={orders}" in line


def test_tail_of_an_unknown_topic_is_a_one_line_error(kafka_bootstrap, monkeypatch, capsys):
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert tail(["no-such-topic-anywhere"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("refold tail: ")
    assert len(err.strip().splitlines()) == 1


def test_tail_ends_at_a_transactional_topic_s_end_a_commit_marker(
    kafka_bootstrap, make_topic, monkeypatch, capsys
):
    # A dead-letter topic is written in transactions: its last offset is a commit marker, no
    # record, so reaching the end is known by position (before: 30 s, then an error).
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    dlq = make_topic(partitions=1, prefix="dlq")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": dlq})
    producer.init_transactions(30)
    for committed in (True, False):  # the log ends with an aborted transaction's marker
        producer.begin_transaction()
        for i in range(3):
            producer.produce(dlq, f"letter-{committed}-{i}".encode(), b"k")
        if committed:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    started = time.monotonic()
    assert tail([dlq, "--from", "earliest", "--json"]) == 0
    assert time.monotonic() - started < 10
    shown = _lines(capsys)
    assert [r["value"] for r in shown] == [f"letter-True-{i}" for i in range(3)]
