"""The spine and a replay on a secured stack: SASL/SCRAM over TLS, and a Redis ACL user.

`refold up --secure` starts a private stack; events are published, order_state folds them (its
process gets the credentials from the launcher's environment), the state is read through the ACL
user and a replay rebuilds it, reading with Spark's JVM `kafka` source: both equal the oracle. No
password is in a log or in `refold status`, and wrong credentials (Kafka's or Redis') get an
error that names the client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.credentials import KafkaCredentialsError
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.registry import processor_spec
from refold.contracts.settings import SparkSettings
from refold.contracts.store.connect import redis_client
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "refold.deploy.cli", "--state-dir", str(tmp_path), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def _refused_by_redis(tmp_path: Path, kafka, wrong) -> None:
    """A wrong Redis password: the services, replay and a processor each say who was refused."""
    launcher = ProcessLauncher(kafka, wrong, SparkSettings(), tmp_path, {})
    env = launcher.env()
    secret = wrong.password.get_secret_value()
    commands = {
        "the HTTP services": [sys.executable, "-m", "refold.deploy.serve_cli", "--port", "1"],
        "replay": [sys.executable, "-m", "refold.replay", "status", "--processor", "order_state"],
    }
    for who, command in commands.items():
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode in (1, 2), done.stderr
        assert f"refused the credentials of {who} (user 'refold')" in done.stderr, done.stderr
        assert secret not in done.stderr + done.stdout
    # A processor stops at once with the reason, instead of waiting as for an outage.
    process = GroupProcess(launcher.argv(["order_state"]), env, tmp_path / "refused.log").start()
    try:
        assert_eventually(lambda: not process.alive(), timeout=120, message=process.log_tail)
        log = process.log_tail()
        assert "refused the credentials of the processor order_state" in log, log
        assert secret not in log
    finally:
        process.stop()


def test_the_spine_and_a_replay_run_on_a_secured_stack(tmp_path, caplog):
    ports = ["--kafka-port", str(free_port()), "--redis-port", str(free_port())]
    up = _cli(tmp_path, *ports, "up", "--secure")
    assert up.returncode == 0, up.stderr
    stack = LocalStack(tmp_path / "stack", int(ports[1]), int(ports[3]))  # secured: as first up
    try:
        assert stack.security is not None
        credentials = json.loads(stack.security.credentials_file.read_text())
        secrets = [v for k, v in credentials.items() if k.endswith("password")]
        assert "SASL_SSL" in up.stdout
        kafka = stack.kafka_settings()
        redis_settings = stack.redis_settings("secured")
        # Without credentials, Redis refuses; with them, it answers.
        with pytest.raises(redis.AuthenticationError):
            redis_client(stack.redis_url).set("x", 1)
        client = redis_client(redis_settings.client_url())
        assert client.acl_whoami() in ("refold", b"refold")

        # Wrong credentials: a clear error that names the client, without the password.
        bad = SecretStr("not-the-password-42")
        wrong = kafka.model_copy(update={"secret_properties": {"sasl.password": bad}})
        with pytest.raises(KafkaCredentialsError, match="the admin client") as refused:
            ensure_topics(wrong.as_librdkafka(), [ORDERS], timeout=10)
        assert "user 'refold'" in str(refused.value)
        assert bad.get_secret_value() not in str(refused.value)

        ensure_topics(kafka.as_librdkafka(), [ORDERS])
        _refused_by_redis(tmp_path, kafka, redis_settings.model_copy(update={"password": bad}))
        events = list(OrderSimulator(600, seed=3))
        publisher = EventPublisher(kafka, topics=[ORDERS])
        publisher.emit_many(events)
        publisher.close()
        options = {"order_state": OrderStateOptions(max_offsets_per_trigger=2_000)}
        launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options)
        reader = StateReader(client, "order_state", redis_settings.key_prefix)
        want = fold_all(OrderStateProjection(), events).states
        process = GroupProcess(
            launcher.argv(["order_state"]), launcher.env(), tmp_path / "live.log"
        ).start()
        try:
            assert_eventually(
                lambda: reader.registry.live() is not None and dict(reader.scan("orders")) == want,
                timeout=300,
                alive=process.alive,
                message=process.log_tail,
            )
            spec = processor_spec("order_state")
            plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
            assert plan.ready, plan.render()
            # The rebuild reads with Spark's own JVM `kafka` source: SASL/SCRAM over TLS
            # through the translated Java client properties.
            jvm = {"order_state": OrderStateOptions(source_format="kafka")}
            rebuilder = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, jvm)
            rebuilt = run_rebuild(
                plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=rebuilder
            )
            assert dict(reader.scan("orders", rebuilt.generation)) == want
        finally:
            process.stop()

        status = _cli(tmp_path, "status")
        assert status.returncode == 0, status.stderr
        assert "secured: SASL_SSL" in status.stdout
        logs = [p.read_text(errors="replace") for p in tmp_path.rglob("*.log")]
        assert len(logs) >= 3  # the broker's, Redis', the processor's (and the rebuild's)
        for text in [up.stdout, up.stderr, status.stdout, caplog.text, *logs]:
            assert not any(secret in text for secret in secrets)
    finally:
        _cli(tmp_path, "down")
