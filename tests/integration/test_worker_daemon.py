"""refold's Python worker daemon, driven the way Spark's executor drives it over a Unix socket.

Spark closes an idle worker's socket to end it (after a minute without tasks, and when the
application stops). PySpark 4.1's own daemon then prints a ``BrokenPipeError`` traceback into
the processor's log; refold's daemon ends the worker quietly. The test plays the executor's part:
it starts the daemon module, connects to the socket it names, takes the forked worker's pid and
closes the connection, then ends the daemon by closing its stdin.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the daemon ignores SIGCHLD, so its children are reaped at once) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def _close_an_idle_worker(module: str, sock_dir: Path) -> str:
    """Run ``python -m module`` as Spark would, close one idle worker; returns its stderr."""
    env = {
        **os.environ,
        "PYTHON_UNIX_DOMAIN_ENABLED": "True",
        "PYTHON_WORKER_FACTORY_SOCK_DIR": str(sock_dir),
        "PYTHON_WORKER_FACTORY_SECRET": "unused-over-unix-sockets",
        "SPARK_REUSE_WORKER": "1",
        "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE": "true",
        "PYTHONUNBUFFERED": "YES",
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", module],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert daemon.stdin is not None
    assert daemon.stdout is not None
    assert daemon.stderr is not None
    try:
        (length,) = struct.unpack("!i", daemon.stdout.read(4))
        path = daemon.stdout.read(length).decode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as worker_socket:
            worker_socket.connect(path)
            (pid,) = struct.unpack("!i", _read_exactly(worker_socket, 4))
            assert pid > 0
        # The executor closed the idle worker's socket: the worker ends.
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the worker outlived its closed socket"
        daemon.stdin.close()  # how Spark stops the daemon
        daemon.wait(20)
        stderr = daemon.stderr.read()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    return stderr.decode()


@pytest.mark.timeout(120)
def test_a_worker_whose_socket_spark_closed_ends_without_a_traceback(tmp_path):
    stderr = _close_an_idle_worker("refold.processors.runtime.spark_daemon", tmp_path)
    assert "Traceback" not in stderr, stderr


@pytest.mark.timeout(120)
def test_pysparks_own_daemon_prints_a_traceback_there(tmp_path):
    # The case above is the one that matters: PySpark's daemon, in the same steps, complains.
    stderr = _close_an_idle_worker("pyspark.daemon", tmp_path)
    assert "BrokenPipeError" in stderr, stderr
