import os
import socket
import subprocess
import sys
import time

import pytest
import redis

from deploy.local_stack import LocalStack, LocalStackError, free_port


def _recorded_pid(stack_dir, name):
    return int((stack_dir / f"{name}.pid").read_text().split()[0])


def _refold(*argv, timeout=60):
    command = [sys.executable, "-m", "deploy.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_up_status_down_through_the_cli(tmp_path):
    kafka_port, redis_port = free_port(), free_port()
    base = [
        sys.executable,
        "-m",
        "deploy.cli",
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
        down = subprocess.run([*base, "down"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0
    assert "stopped" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    status = subprocess.run([*base, "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 3
    assert "stopped" in status.stdout


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
        up = _refold("up", *state)
        assert up.returncode == 0, up.stderr
        assert f"kafka was running already (pid {kafka_pid}" in up.stdout
        assert _recorded_pid(tmp_path / "stack", "kafka") == kafka_pid
        assert redis.Redis(port=redis_port).get("refold-test:kept") == b"yes"
    finally:
        _refold("down", *state)
