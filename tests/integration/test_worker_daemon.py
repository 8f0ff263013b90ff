"""refold's Python worker daemons, driven the way Spark's JVM drives them over a Unix socket.

Spark closes an idle worker's socket to end it (after a minute without tasks, and when the
application stops). PySpark 4.1's own daemon then prints a ``BrokenPipeError`` traceback into
the processor's log; refold's daemon ends the worker quietly. That holds for the task daemon
(``spark.python.daemon.module``) and for the planners' daemons, which Spark always starts as
``python -m pyspark.daemon``: refold's ``sitecustomize`` on the driver JVM's ``PYTHONPATH``
runs refold's daemon there. The test plays the JVM's part: it starts the daemon, connects to the
socket it names, takes the forked worker's pid and closes the connection, then ends the daemon by
closing its stdin.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from refold.processors.runtime.spark_archives import WORKER_STARTUP


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for the daemon's socket, as Spark's (``/tmp/spark-<uuid>``) is.

    A Unix socket's path has at most 107 bytes, and pytest's ``tmp_path`` can be longer than
    that with the daemon's ``.<uuid>.sock`` added (it was in CI's clean clone).
    """
    with tempfile.TemporaryDirectory(prefix="refold-sock-", dir="/tmp") as name:
        yield Path(name)


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


def _close_an_idle_worker(module: str, sock_dir: Path, python_path: str = "") -> str:
    """Run ``python -m module`` as Spark would, close one idle worker; returns its stderr."""
    env = {
        **os.environ,
        "PYTHONPATH": python_path,
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
        header = daemon.stdout.read(4)
        if len(header) < 4:  # the daemon ended before naming its socket: say why
            daemon.wait(20)
            pytest.fail(f"{module} did not start: {daemon.stderr.read().decode()}")
        (length,) = struct.unpack("!i", header)
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
def test_a_worker_whose_socket_spark_closed_ends_without_a_traceback(sock_dir):
    # As a refold driver's JVM starts it (its startup directory first), and as an executor does.
    for python_path in (str(WORKER_STARTUP), ""):
        stderr = _close_an_idle_worker(
            "refold.processors.runtime.spark_daemon", sock_dir, python_path
        )
        assert stderr == "", stderr  # no traceback, no warning: nothing at all


@pytest.mark.timeout(120)
def test_a_planners_daemon_started_by_a_refold_driver_ends_its_workers_quietly_too(sock_dir):
    # As the driver JVM refold starts runs a planner's daemon: its startup directory first.
    stderr = _close_an_idle_worker("pyspark.daemon", sock_dir, str(WORKER_STARTUP))
    assert stderr == "", stderr


@pytest.mark.timeout(120)
def test_pysparks_own_daemon_prints_a_traceback_there(sock_dir):
    # What the cases above guard against: PySpark's daemon alone, in the same steps, complains.
    stderr = _close_an_idle_worker("pyspark.daemon", sock_dir)
    assert "BrokenPipeError" in stderr, stderr
