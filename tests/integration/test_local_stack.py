import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from refold.contracts.store.connect import redis_client
from refold.deploy import kafka_broker
from refold.deploy.local_stack import LocalStack, LocalStackError, _port_open, free_port
from refold.deploy.redis_cluster import free_port_run


def _recorded_pid(stack_dir, name):
    return int((stack_dir / f"{name}.pid").read_text().split()[0])


def _refold(*argv, timeout=60):
    command = [sys.executable, "-m", "refold.deploy.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_up_status_down_through_the_cli(tmp_path):
    kafka_port, redis_port = free_port(), free_port()
    base = [
        sys.executable,
        "-m",
        "refold.deploy.cli",
        "--state-dir",
        str(tmp_path),
        "--kafka-port",
        str(kafka_port),
        "--redis-port",
        str(redis_port),
    ]
    up = subprocess.run([*base, "up"], capture_output=True, text=True, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        assert f"127.0.0.1:{kafka_port}" in up.stdout
        # What `up` says stops it does: the state dir is not the default, so it is named.
        assert f"stop it: refold down --state-dir {tmp_path}\n" in up.stdout
        status = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0
        assert status.stdout.count("running (pid") == 2
        assert redis.Redis(port=redis_port).ping()
        again = subprocess.run([*base, "up"], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout
        pids = [_recorded_pid(tmp_path / "stack", name) for name in ("kafka", "redis")]
        assert [_recorded_pid(tmp_path / "stack", n) for n in ("kafka", "redis")] == pids
    finally:
        down = _refold("down", "--state-dir", str(tmp_path))
    assert down.returncode == 0
    assert "stopped" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    status = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 3
    assert "stopped" in status.stdout


def test_up_with_a_redis_cluster_stays_a_cluster_and_down_stops_every_node(tmp_path):
    first = free_port_run(6)
    base = [sys.executable, "-m", "refold.deploy.cli", "--state-dir", str(tmp_path)]
    ports = ["--kafka-port", str(free_port()), "--redis-port", str(first)]
    up = subprocess.run(
        [*base, "up", "--redis-cluster", *ports], capture_output=True, text=True, timeout=120
    )
    stack = tmp_path / "stack"
    try:
        assert up.returncode == 0, up.stderr
        assert f"REFOLD_REDIS__URL=redis+cluster://127.0.0.1:{first}" in up.stdout
        client = redis_client(f"redis+cluster://127.0.0.1:{first}")
        assert client.set("{t}k", "v")
        assert client.get("{t}k") == b"v"
        status = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30)
        assert status.stdout.count("running (pid") == 7  # Kafka and six nodes
        # Without the flag, the state dir stays what it was first started as.
        cluster = LocalStack(stack).cluster
        assert cluster is not None
        assert cluster.first_port == first
        pids = [cluster.pid(port) for port in cluster.ports]
    finally:
        down = subprocess.run([*base, "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0
    assert down.stdout.count("redis (port") == 6
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_taken_port_is_a_clear_error_and_starts_nothing(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        stack = LocalStack(tmp_path, kafka_port=taken, redis_port=free_port())
        with pytest.raises(LocalStackError, match=f"port {taken} for kafka is taken"):
            stack.start()
    assert not any(server.running for server in stack.status())


def test_ports_after_the_subcommand_are_remembered_by_status_and_down(tmp_path):
    kafka_port, redis_port = free_port(), free_port()
    state = ["--state-dir", str(tmp_path)]
    try:
        up = _refold("up", *state, "--kafka-port", str(kafka_port), "--redis-port", str(redis_port))
        assert up.returncode == 0, up.stderr
        assert f"127.0.0.1:{kafka_port}" in up.stdout
        assert f"redis://127.0.0.1:{redis_port}/0" in up.stdout

        status = _refold("status", *state, timeout=30)
        assert status.returncode == 0, status.stderr
        lines = {line.split()[0]: line for line in status.stdout.splitlines()}
        assert f"port {kafka_port} " in lines["kafka"]
        assert "running (pid" in lines["kafka"]
        assert f"port {redis_port} " in lines["redis"]
        assert "running (pid" in lines["redis"]
        assert redis.Redis(port=redis_port).ping()
        pids = [_recorded_pid(tmp_path / "stack", name) for name in ("kafka", "redis")]

        down = _refold("down", *state)
        assert down.returncode == 0, down.stderr
        assert f"kafka (port {kafka_port})" in down.stdout
        assert f"redis (port {redis_port})" in down.stdout
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        after = _refold("status", *state, timeout=30)
        assert after.returncode == 3
        assert after.stdout.count("stopped") == 2
    finally:
        # Whatever the CLI did, end the recorded PIDs (a no-op once `refold down` worked).
        LocalStack(tmp_path / "stack").stop()


def test_up_starts_the_missing_redis_and_redis_keeps_its_keys_through_a_kill(tmp_path):
    # Redis holds what the log cannot rebuild (API keys, webhook positions): the local stack's
    # Redis appends to a file (AOF, fsync every second), and `refold up` after Redis died
    # starts Redis, leaving the running broker alone.
    kafka_port, redis_port = free_port(), free_port()
    state = ["--state-dir", str(tmp_path), "--kafka-port", str(kafka_port)]
    state += ["--redis-port", str(redis_port)]
    stack = LocalStack(tmp_path / "stack", kafka_port, redis_port)
    try:
        assert _refold("up", *state).returncode == 0
        kafka_pid = _recorded_pid(tmp_path / "stack", "kafka")
        client = redis.Redis(port=redis_port)
        client.set("refold-test:kept", "yes")
        time.sleep(1.5)  # appendfsync everysec
        stack.kill("redis")
        # Half a stack is not a running one: status names what is down and exits 6.
        status = _refold("status", *state, timeout=30)
        assert status.returncode == 6, status.stdout + status.stderr
        assert f"down: redis (port {redis_port})" in status.stderr
        assert "Operator action: refold up" in status.stderr
        lines = {line.split()[0]: line for line in status.stdout.splitlines()}
        assert f"running (pid {kafka_pid})" in lines["kafka"]
        assert "stopped" in lines["redis"]
        up = _refold("up", *state)
        assert up.returncode == 0, up.stderr
        assert f"kafka was running already (pid {kafka_pid}" in up.stdout
        assert _refold("status", *state, timeout=30).returncode == 0
        assert _recorded_pid(tmp_path / "stack", "kafka") == kafka_pid
        assert redis.Redis(port=redis_port).get("refold-test:kept") == b"yes"
    finally:
        _refold("down", *state)


def _producer(bootstrap: str, acked: list[bytes]) -> Producer:
    """An acks=all idempotent producer that appends each acknowledged value to ``acked``."""

    def report(err, msg):
        if err is None:
            acked.append(msg.value())

    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": 120_000,  # records waiting out the broker's restart go on after
    }
    return Producer({**config, "on_delivery": report})


def _produce(producer: Producer, topic: str, values: range) -> None:
    for i in values:
        producer.produce(topic, key=str(i % 16).encode(), value=f"v{i}".encode())
        producer.poll(0)


def _read_all(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t-read", "enable.partition.eof": True}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    values, ended = [], set()
    deadline = time.monotonic() + 60
    while len(ended) < partitions and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1):
            if message.error() is None:
                values.append(message.value())
            elif message.error().code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition())
    consumer.close()
    return values


def test_the_broker_keeps_its_log_groups_and_offsets_through_down_up_and_a_kill(tmp_path):
    # The log is the source of truth: `refold down` + `refold up` keeps every topic, record,
    # group and committed offset, and a kill -9 under acks=all traffic loses no acknowledged
    # record once the broker is started again.
    stack = LocalStack(tmp_path / "stack", free_port(), free_port(), redis_persistent=False)
    topic = "durable"
    try:
        stack.start()
        bootstrap = stack.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result()
        first: list[bytes] = []
        producer = _producer(bootstrap, first)
        _produce(producer, topic, range(3000))
        producer.flush(30)
        assert len(first) == 3000
        committer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kept-group"})
        committer.commit(offsets=[TopicPartition(topic, 1, 42)], asynchronous=False)
        committer.close()
        stack.stop()
        assert not any(s.running for s in stack.status())
        stack.start()
        (kafka,) = [s for s in stack.status() if s.name == "kafka"]
        assert kafka.data_dir == tmp_path / "stack" / "kafka" / "data"
        assert kafka.disk_bytes > 0
        assert kafka.version.startswith("4.")
        assert sorted(_read_all(bootstrap, topic, 3)) == sorted(first)
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "kept-group"})
        (committed,) = reader.committed([TopicPartition(topic, 1)], timeout=10)
        reader.close()
        assert committed.offset == 42
        # kill -9 under traffic: once some records are acknowledged, the broker dies with
        # others in flight; the producer retries them after the restart.
        second: list[bytes] = []
        producer = _producer(bootstrap, second)
        _produce(producer, topic, range(3000, 5000))
        while len(second) < 500:
            producer.poll(0.01)
        stack.kill("kafka")
        acknowledged_before_kill = set(second)
        _produce(producer, topic, range(5000, 6000))
        stack.restart("kafka")
        assert producer.flush(120) == 0
        kept = _read_all(bootstrap, topic, 3)
        assert set(first) | acknowledged_before_kill <= set(kept)
        assert set(second) <= set(kept)
        assert len(second) == 3000  # idempotence: each retried record once
        assert len(kept) == len(set(kept)) == 6000
    finally:
        stack.stop()


def test_a_data_directory_kafka_cannot_use_is_a_one_line_error(tmp_path):
    data = tmp_path / "stack" / "kafka" / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\n")  # no cluster id
    stack = LocalStack(tmp_path / "stack", free_port(), free_port(), redis_persistent=False)
    with pytest.raises(LocalStackError, match=r"data directory .* is corrupt") as caught:
        stack.start()
    assert "Operator action" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not any(s.running for s in stack.status())
    # The redis-server it started first is stopped, not just forgotten (it once outlived the
    # test: its pid file was removed while it still ran).
    assert not _port_open(stack.redis_port)


def test_missing_jars_or_java_say_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("REFOLD_KAFKA_JARS", str(tmp_path / "nothing"))
    stack = LocalStack(tmp_path / "stack", free_port(), free_port(), redis_persistent=False)
    with pytest.raises(LocalStackError, match=r"jars are not in .*run `make setup`"):
        stack.start()
    monkeypatch.delenv("REFOLD_KAFKA_JARS")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    only_redis = tmp_path / "bin"  # a PATH with redis-server and no java
    only_redis.mkdir()
    (only_redis / "redis-server").symlink_to(shutil.which("redis-server"))
    monkeypatch.setenv("PATH", str(only_redis))
    with pytest.raises(LocalStackError, match="Java is not installed"):
        stack.start()
    assert not any(s.running for s in stack.status())
    assert not _port_open(stack.redis_port)


def test_a_cluster_id_that_starts_with_a_dash_is_formatted(tmp_path, monkeypatch):
    # One id in 64 starts with "-" (URL-safe base64): it must not be read as an option.
    monkeypatch.setattr(kafka_broker, "kafka_uuid", lambda: "-Abcdefghijklmnopqrstu")
    broker = kafka_broker.KafkaBroker(tmp_path / "kafka", free_port(), free_port())
    broker.prepare()
    meta = (broker.data_dir / "meta.properties").read_text()
    assert "cluster.id=-Abcdefghijklmnopqrstu" in meta
    broker.prepare()  # formatted once: a second start keeps it
    assert (broker.data_dir / "meta.properties").read_text() == meta
