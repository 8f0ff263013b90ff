"""A topic that a producer knowing nothing of refold writes is folded by order_state (issue 47).

The topic moves over as a team would move an existing one (issue 47 item 5): refold's producer
SDK writes the first part of the orders in single-object encoding, then a plain confluent-kafka
producer with confluent-kafka's own ``AvroSerializer`` (registry framing, RecordNameStrategy
subjects, the latest registered version) writes the rest, and one record carries a schema id the
registry does not know. order_state folds the topic in Spark with the registry of the session
(Apicurio, as ``refold up --schema-registry`` starts it, the contracts registered by ``refold
contracts publish``): its state equals the plain-Python oracle over every event, and the
unknown id is a dead letter with its reason.

Then the same topic goes through a kill -9 and a replay (issue 47's tests): a processor
process folding it is killed with SIGKILL mid-run, the fold is restarted from the checkpoint
it left (in this test's Spark session), then `replay --to-earliest --execute` rebuilds a new
generation from offset 0 in a processor process of its own: state == the oracle each time.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from refold.contracts.catalog import default_catalog
from refold.contracts.process_group import GroupProcess
from refold.contracts.schema_registry import SchemaRegistrySettings
from refold.deploy import contracts_cli
from refold.deploy.simulators.orders import OrderSimulator
from tests.support.dead_letters import dlq_letters

from .conftest import oracle


def foreign_producer(bootstrap: str, registry_url: str, topic: str, events) -> None:
    """Write ``events`` as a plain confluent-kafka application would: AvroSerializer, no refold."""
    client = SchemaRegistryClient({"url": registry_url})
    conf = {
        "auto.register.schemas": False,
        "use.latest.version": True,
        "subject.name.strategy": record_subject_name_strategy,
    }
    catalog = default_catalog()  # the .avsc files, as a team's repository holds them
    serializers = {
        name: AvroSerializer(client, catalog.latest(name).path.read_text(), conf=conf)
        for name in {event_type for event_type, _ in events}
    }
    # murmur2_random: the Java client's partitioner, so an order stays on one partition
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    context = SerializationContext(topic, MessageField.VALUE)
    for event_type, event in events:
        value = serializers[event_type](event, context)
        producer.produce(topic, value, event["order_id"].encode())
    producer.produce(topic, b"\x00\x00\x01\x86\x9f" + b"\x02", b"o-unknown-id")  # id 99999
    assert producer.flush(30) == 0


def replay_to_earliest(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    """`replay --processor order_state --to-earliest --execute`, as an operator runs it."""
    command = ["--no-progress", "--processor", "order_state", "--to-earliest", "--execute"]
    return subprocess.run(
        [sys.executable, "-m", "refold.replay", *command, *flags],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_order_state_folds_a_topic_a_foreign_avro_serializer_writes_through_kill_9_and_replay(
    spark, world, schema_registry, monkeypatch
):
    monkeypatch.setenv("REFOLD_SCHEMA_REGISTRY__URL", schema_registry.url)
    registry = SchemaRegistrySettings(url=schema_registry.url)
    world.launcher = dataclasses.replace(world.launcher, schema_registry=registry)
    assert contracts_cli.main(["publish"]) == 0
    events = list(OrderSimulator(400, seed=47))
    half = len(events) // 2
    world.publisher().emit_many(events[:half])  # single-object: before the move
    foreign_producer(
        world.kafka.bootstrap_servers, schema_registry.url, world.topic.name, events[half:]
    )
    total = len(events) + 1  # and the record of an unknown id
    expected = oracle(events)

    # 1. A processor process (registry from its environment), small batches, SIGKILLed once
    # it has applied half the log, within the registry-framed part.
    crash = GroupProcess(
        world.launcher.argv(["order_state"]),
        {**world.env, "REFOLD_ORDER_STATE__MAX_OFFSETS_PER_TRIGGER": "200"},
        world.state_dir / "logs" / "crash.log",
    ).start()
    killed_at = world.kill_after(crash, int(0.6 * total))
    assert killed_at < total, "the processor ended before the kill"

    # 2. Restarted: from the checkpoint the killed driver left, to the end of the log.
    generation = world.run_available_now(spark)
    assert generation == 1
    states, totals = world.state(generation)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    letters = dlq_letters(world.kafka.bootstrap_servers, world.dlq)
    reasons = [reason for _, _, reason, _ in letters]
    assert reasons.count("unknown-schema-id") == 1
    assert len(reasons) == 1 + len(expected.rejected)

    # 3. Replayed from offset 0 into generation 2 (its processor: a process of replay's),
    # flipped, == the oracle again; the unknown id is still the one letter of its origin.
    # The plan's decode check finds the unknown id first, and refuses until told to accept it.
    refused = replay_to_earliest(world.env)
    assert refused.returncode != 0
    assert "unknown schema id 99999 (unknown-schema-id) (1 records)" in refused.stdout
    assert "pass --accept-dead-letters" in refused.stdout
    done = replay_to_earliest(world.env, "--accept-dead-letters")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    live = world.reader().registry.live()
    assert live == 2
    states, totals = world.state(live)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    letters = dlq_letters(world.kafka.bootstrap_servers, world.dlq)
    assert len({(p, o) for p, o, reason, _ in letters if reason == "unknown-schema-id"}) == 1
