"""Spark's streaming source runner, started after the driver removed its socket.

A processor stopped within its first seconds can remove the Unix socket its Python data
source's reader (``python -m pyspark.sql.streaming.python_streaming_source_runner``) is about
to connect to. The runner then fails with ``CANNOT_OPEN_SOCKET``; in a refold driver's Python
processes that is one line in the processor's log, not a traceback
(``refold.processors.runtime.spark_exits``). The test starts the runner as the driver's JVM
does, with refold's startup directory on its path, and a socket path that is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from refold.processors.runtime.spark_archives import WORKER_STARTUP

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def _run_runner(socket_path: Path, python_path: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": python_path,
        "PYTHON_WORKER_FACTORY_SOCK_PATH": str(socket_path),
        "SPARK_AUTH_SOCKET_TIMEOUT": "5",
    }
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)  # over Unix sockets Spark sets none
    return subprocess.run(
        [sys.executable, "-m", RUNNER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(120)
def test_a_runner_whose_driver_stopped_first_says_so_in_one_line(tmp_path):
    gone = tmp_path / "gone.sock"
    done = _run_runner(gone, str(WORKER_STARTUP))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        f"refold: -m {RUNNER} ended without work: Spark's driver had stopped and removed its "
        f"socket ({gone}) before this process connected"
    ]


@pytest.mark.timeout(120)
def test_a_runner_that_cannot_connect_to_a_socket_that_is_there_keeps_its_traceback(tmp_path):
    # Not the driver stopping: something else is wrong, and the traceback says what.
    not_a_socket = tmp_path / "not-a-socket"
    not_a_socket.write_text("")
    done = _run_runner(not_a_socket, str(WORKER_STARTUP))
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "CANNOT_OPEN_SOCKET" in done.stderr


@pytest.mark.timeout(120)
def test_pysparks_runner_alone_prints_the_traceback(tmp_path):
    # What the first case guards against: the same start without refold's startup directory.
    done = _run_runner(tmp_path / "gone.sock", "")
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "CANNOT_OPEN_SOCKET" in done.stderr


@pytest.mark.timeout(120)
def test_a_runner_whose_driver_closes_its_socket_while_it_works_says_so_in_one_line():
    # The driver's side accepts, leaves the runner's first write (its pid) unread and closes:
    # the runner's next read is reset, and writing its error back finds the pipe broken.
    # A short directory: a socket's path holds 107 bytes, more than pytest's tmp_path leaves.
    with tempfile.TemporaryDirectory(prefix="refold-runner-") as short:
        path = Path(short) / "driver.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(path))
            server.listen(1)
            server.settimeout(60)  # a runner that never connects fails the test, not hangs

            def close_on_connect() -> None:
                connection, _ = server.accept()
                connection.recv(0)  # nothing read: the runner's pid stays unread
                time.sleep(0.5)  # its write has arrived
                connection.close()

            driver = threading.Thread(target=close_on_connect)
            driver.start()
            done = _run_runner(path, str(WORKER_STARTUP))
            driver.join()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        f"refold: -m {RUNNER} ended: Spark's driver closed its socket ({path}) while this "
        "process worked (its query stopped)"
    ]
