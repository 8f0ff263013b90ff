"""Child processes refold starts and stops: each leads a process group of its own, by PID.

The one owner of starting and stopping processes: processors (the demo, replay's rebuild, the
tests), replays started over HTTP, and the servers and daemons of the local stack and cluster
(:func:`terminate`). Never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GroupProcess", "alive", "terminate"]

_STOP_GRACE_S = 30.0  # a micro-batch in flight finishes; Spark stops its query cleanly
_GROUP_EXIT_S = 5.0  # after the leader: its JVM and Python workers notice it is gone


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


def start_daemon(command: Sequence[str], log_file: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start a server or daemon that outlives its caller, its output appended to ``log_file``.

    A new session (and process group): ``refold up`` returns while it goes on, Ctrl-C in a
    test run does not reach it, and its owner stops it by its PID (:func:`terminate`).
    ``popen`` adds ``env``, ``cwd``... The one way the local stack's servers, the local Redis
    Cluster's nodes and the Spark cluster's daemons start.
    """
    with log_file.open("ab") as log:
        return subprocess.Popen(  # noqa: S603 - the caller's fixed argv, no shell
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **popen,
        )


@dataclass
class GroupProcess:
    """A child process leading a process group of its own, its output in ``log_path``.

    A processor (``argv`` and ``env`` from :class:`refold.contracts.processors.ProcessLauncher`),
    or a replay started by the HTTP API. Its own group: stopping it ends the Spark JVM and the
    Python workers it started, and nothing else, and a Ctrl-C in the parent's terminal does not
    reach it.
    """

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> GroupProcess:
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

    def wait(self, timeout: float | None = None) -> int:
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

    def stop(self, grace_s: float = _STOP_GRACE_S) -> int | None:
        """End it and everything it started (its process group); idempotent.

        SIGTERM to the leader only (a processor's driver stops its query after the current
        batch and releases its lease; its JVM and workers exit with it). After ``grace_s`` the
        whole group is SIGKILLed, and so is what is left of the group shortly after a clean
        exit.

        Returns:
            The exit code, None if it was never started.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        deadline = time.monotonic() + _GROUP_EXIT_S
        while alive(self.pid, group=True):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                break
            time.sleep(0.1)
        return self.process.returncode

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has ended (None while it runs or before it started)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 30) -> str:
        """The end of its log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
