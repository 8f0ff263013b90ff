"""Start and stop processor processes (the demo and the tests use this; replay has its own loop).

Each processor runs in its own process group, so stopping it also ends the Spark JVM and the
Python workers it started, and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessorProcess", "alive", "tcp_port", "terminate"]

_STOP_GRACE_S = 30.0  # a micro-batch in flight finishes; Spark stops its query cleanly


def alive(pid: int, *, group: bool = False) -> bool:
    """True while ``pid`` (or, with ``group``, any process of its group) exists."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(pid: int, grace_s: float, *, group: bool = False) -> None:
    """SIGTERM ``pid`` (or its process group), then SIGKILL after ``grace_s``; reap our child.

    The one way refold stops a server or daemon it started (the local stack's servers, the
    Spark cluster's daemons), by PID, never by name.
    """
    send = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if not alive(pid, group=group):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port 1-65535 (a bad value is a usage error)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        msg = f"{text!r} is not a TCP port 1-65535"
        raise argparse.ArgumentTypeError(msg)
    return port


@dataclass
class ProcessorProcess:
    """A processor process (``argv`` from the process contract) with its output in ``log_path``.

    Build ``argv`` and ``env`` with :class:`refold.contracts.processors.ProcessLauncher`.
    """

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ProcessorProcess:
        """Start it (in a new process group)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our interpreter, our module
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        if self.process is None:
            msg = "not started"
            raise RuntimeError(msg)
        return self.process.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait for it to exit; its exit code.

        Raises:
            subprocess.TimeoutExpired: Still running after ``timeout`` seconds.
        """
        if self.process is None:
            msg = "not started"
            raise RuntimeError(msg)
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, for tests."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self) -> int | None:
        """SIGTERM (clean stop after the current batch), then SIGKILL after a grace period.

        Returns:
            The exit code, None if it was never started.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            # Only the driver gets SIGTERM: it stops the query, and the JVM follows it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()
        # The JVM and Python workers exit with their parent; make sure of it.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        return self.process.returncode

    def log_tail(self, lines: int = 30) -> str:
        """The end of its log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
