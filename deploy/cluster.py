"""A local Spark standalone cluster (one master, one worker) from the pyspark wheel.

``refold cluster up|down|status`` (:mod:`refold.deploy.cluster_cli`): the master and the worker
are ``$SPARK_HOME/bin/spark-class`` processes (``org.apache.spark.deploy.master.Master`` /
``...worker.Worker``), with ``SPARK_HOME`` the pyspark package directory. Processors submit
to it with ``REFOLD_SPARK__MASTER=spark://127.0.0.1:17077`` and ``REFOLD_SPARK__CORES_MAX`` (so
several applications share its cores); see ``docs/cluster.md``.

Lifecycle contract, as for :mod:`refold.deploy.local_stack`: :meth:`SparkCluster.start` writes one
pid file per daemon under ``state_dir`` (``master.pid``: "PID PORT WEBUI_PORT", ``worker.pid``: "PID
WEBUI_PORT") and one log file each; the worker's application directories (executor logs, shipped
code) go to ``state_dir/work``. Each daemon runs in its own process group (its executors and their
Python workers join it), and :meth:`SparkCluster.stop` ends exactly the recorded groups after
checking that the recorded PID still runs that daemon; never processes found by name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from refold.contracts.errors import RefoldError
from refold.contracts.process_group import start_daemon, terminate

__all__ = [
    "DEFAULT_MASTER_PORT",
    "DEFAULT_WEBUI_PORT",
    "DEFAULT_WORKER_CORES",
    "DEFAULT_WORKER_MEMORY",
    "DEFAULT_WORKER_WEBUI_PORT",
    "ClusterError",
    "ClusterSpec",
    "DaemonStatus",
    "SparkCluster",
    "daemon_command",
    "daemon_env",
    "parse_pid_file",
]

# Away from Spark's own 7077/8080/8081, so a developer's Spark is not disturbed.
DEFAULT_MASTER_PORT = 17077
DEFAULT_WEBUI_PORT = 18080
DEFAULT_WORKER_WEBUI_PORT = 18081
# The whole 2-core development machine; applications take a share with spark.cores.max.
DEFAULT_WORKER_CORES = 2
# Two applications with the default 1g executors (SparkSettings.executor_memory) fit side by side.
DEFAULT_WORKER_MEMORY = "2g"
# Heap of the master and worker daemons themselves (Spark's default is 1g each); executors are
# separate JVMs sized by spark.executor.memory.
_DAEMON_MEMORY = "512m"
# JVM start-up and worker registration took ~11 s on the loaded 2-core machine, and more than
# 90 s once in CI (a stall that also fenced the broker).
_READY_TIMEOUT_S = 180.0
# The worker stops its executors (and they their Python workers) on SIGTERM.
_STOP_GRACE_S = 20.0

Role = Literal["master", "worker"]
_START_ORDER: tuple[Role, ...] = ("master", "worker")
_MAIN_CLASS: dict[Role, str] = {
    "master": "org.apache.spark.deploy.master.Master",
    "worker": "org.apache.spark.deploy.worker.Worker",
}


class ClusterError(RefoldError):
    """The local Spark cluster could not be started, stopped or inspected."""

    code: ClassVar[str] = "CLUSTER_ERROR"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Where the cluster listens and what its one worker offers.

    Attributes:
        master_port: The master's RPC port (the ``spark://`` URL).
        webui_port: The master's web UI (and its JSON status at ``/json/``).
        worker_webui_port: The worker's web UI.
        worker_cores: Cores the worker offers to applications.
        worker_memory: Memory the worker offers to executors (``2g``, ``512m``).
        host: The loopback address every daemon binds to.
    """

    master_port: int = DEFAULT_MASTER_PORT
    webui_port: int = DEFAULT_WEBUI_PORT
    worker_webui_port: int = DEFAULT_WORKER_WEBUI_PORT
    worker_cores: int = DEFAULT_WORKER_CORES
    worker_memory: str = DEFAULT_WORKER_MEMORY
    host: str = "127.0.0.1"

    @property
    def master_url(self) -> str:
        """The URL applications submit to."""
        return f"spark://{self.host}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        """The master's web UI."""
        return f"http://{self.host}:{self.webui_port}"

    def ports(self) -> dict[str, int]:
        """Each port ``up`` needs free, by the option that changes it."""
        return {
            "--master-port / REFOLD_CLUSTER_MASTER_PORT": self.master_port,
            "--webui-port / REFOLD_CLUSTER_WEBUI_PORT": self.webui_port,
            "--worker-webui-port / REFOLD_CLUSTER_WORKER_WEBUI_PORT": self.worker_webui_port,
        }


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """What ``refold cluster status`` reports for one daemon."""

    role: Role
    pid: int | None
    port: int | None
    webui_port: int | None
    running: bool
    log_file: Path


def parse_pid_file(text: str) -> tuple[int | None, list[int]]:
    """Read a pid file: ``"PID PORT..."``.

    Args:
        text: The file's content.

    Returns:
        The PID (None if unreadable) and the recorded ports, in order.
    """
    words = text.split()
    try:
        pid = int(words[0])
    except (ValueError, IndexError):
        return None, []
    ports = []
    for word in words[1:]:
        try:
            ports.append(int(word))
        except ValueError:
            break
    return pid, ports


def daemon_command(role: Role, spec: ClusterSpec, spark_home: Path, work_dir: Path) -> list[str]:
    """The ``spark-class`` command line of one daemon (pure).

    Args:
        role: ``master`` or ``worker``.
        spec: Ports, cores, memory.
        spark_home: Spark's home (the pyspark package directory for the wheel).
        work_dir: The worker's directory for application files and executor logs.

    Returns:
        The argv.
    """
    head = [str(spark_home / "bin" / "spark-class"), _MAIN_CLASS[role]]
    options: dict[str, object]
    if role == "master":
        options = {"--port": spec.master_port, "--webui-port": spec.webui_port}
    else:
        head.append(spec.master_url)
        options = {
            "--cores": spec.worker_cores,
            "--memory": spec.worker_memory,
            "--webui-port": spec.worker_webui_port,
            "--work-dir": work_dir,
        }
    return [*head, "--host", spec.host, *(str(w) for pair in options.items() for w in pair)]


def daemon_env(
    role: Role, spec: ClusterSpec, spark_home: Path, base: Mapping[str, str]
) -> dict[str, str]:
    """The environment of one daemon (pure): ``base`` plus Spark's launcher variables.

    Args:
        role: ``master`` or ``worker``.
        spec: Its host.
        spark_home: Spark's home.
        base: The caller's environment (its ``SPARK_*_OPTS`` are kept, ours appended).

    Returns:
        The environment.
    """
    # A taken port must fail, not silently move to the next one (Spark's default retries 16
    # ports, and `status` and the printed URL would then be wrong).
    opts = ["-Dspark.port.maxRetries=0"]
    if role == "master":
        # The REST submission server would take port 6066 on every cluster; refold does not use it.
        opts.append("-Dspark.master.rest.enabled=false")
    key = "SPARK_MASTER_OPTS" if role == "master" else "SPARK_WORKER_OPTS"
    return {
        **base,
        "SPARK_HOME": str(spark_home),
        # Bind to loopback and skip the "hostname resolves to a loopback address" probe.
        "SPARK_LOCAL_IP": spec.host,
        "SPARK_DAEMON_MEMORY": base.get("SPARK_DAEMON_MEMORY", _DAEMON_MEMORY),
        key: " ".join([base.get(key, ""), *opts]).strip(),
    }


def _spark_home() -> Path:
    """``SPARK_HOME`` if set (as pyspark itself does), else the pyspark package directory."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        msg = "pyspark is not installed. Operator action: `pip install -e '.[spark]'` (make setup)."
        raise ClusterError(msg)
    home = Path(os.environ.get("SPARK_HOME") or Path(spec.origin).parent)
    if not (home / "bin" / "spark-class").exists():
        msg = (
            f"no bin/spark-class under SPARK_HOME {home}. Operator action: unset SPARK_HOME "
            "(the pyspark wheel ships it) or point it at a Spark 4 distribution."
        )
        raise ClusterError(msg)
    return home


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        msg = (
            "java is not installed. Operator action: `apt-get install -y "
            "openjdk-17-jre-headless` (Spark 4 needs Java 17 or 21), or set JAVA_HOME."
        )
        raise ClusterError(msg)


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def _pid_runs(pid: int, main_class: str) -> bool:
    """True if ``pid`` is alive and runs ``main_class`` (guards against PID reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return True  # no /proc: trust the pid file
    # Empty for a few milliseconds while the process execs (measured right after spawning).
    return not cmdline or main_class in cmdline


class SparkCluster:
    """One Spark standalone master and one worker on loopback, with pid and log files.

    Args:
        state_dir: Pid files, logs and the worker's work directory.
        spec: Ports, cores and memory for :meth:`start`; :meth:`status` and :meth:`stop` use
            the ports recorded in the pid files.
    """

    def __init__(self, state_dir: Path, spec: ClusterSpec | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.spec = spec if spec is not None else ClusterSpec()

    def _pid_file(self, role: Role) -> Path:
        return self.state_dir / f"{role}.pid"

    def log_file(self, role: Role) -> Path:
        """The daemon's log (its stdout and stderr)."""
        return self.state_dir / f"{role}.log"

    @property
    def work_dir(self) -> Path:
        """The worker's application directories (executor logs, shipped code)."""
        return self.state_dir / "work"

    def _recorded(self, role: Role) -> tuple[int | None, list[int]]:
        try:
            return parse_pid_file(self._pid_file(role).read_text())
        except OSError:
            return None, []

    def status(self) -> list[DaemonStatus]:
        """Each daemon's recorded pid and ports, and whether it still runs.

        Returns:
            The master, then the worker.
        """
        result = []
        for role in _START_ORDER:
            pid, ports = self._recorded(role)
            running = pid is not None and _pid_runs(pid, _MAIN_CLASS[role])
            port = ports[0] if role == "master" and ports else None
            webui_at = 1 if role == "master" else 0
            webui = ports[webui_at] if len(ports) > webui_at else None
            result.append(DaemonStatus(role, pid, port, webui, running, self.log_file(role)))
        return result

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None if it does not answer."""
        master = self.status()[0]
        if not master.running or master.webui_port is None:
            return None
        return _master_json(self.spec.host, master.webui_port)

    def start(self) -> SparkCluster:
        """Start the master, then the worker; wait until the worker has registered.

        Raises:
            ClusterError: Already running, a port is taken, java or pyspark is missing, or a
                daemon did not become ready (its log's end is in the message). Nothing is left
                running then.
        """
        for daemon in self.status():
            if daemon.running:
                msg = (
                    f"the Spark {daemon.role} is already running (pid {daemon.pid}). "
                    "Operator action: `refold cluster down` first, or use it as it is "
                    "(`refold cluster status`)."
                )
                raise ClusterError(msg)
        for option, port in self.spec.ports().items():
            if _port_open(self.spec.host, port):
                msg = (
                    f"port {port} is taken by another program. Operator action: stop it, or "
                    f"choose another port with {option}."
                )
                raise ClusterError(msg)
        _check_java()
        spark_home = _spark_home()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        try:
            master = self._spawn("master", spark_home)
            self._wait(
                master,
                "master",
                lambda: _port_open(self.spec.host, self.spec.master_port),
                deadline,
            )
            worker = self._spawn("worker", spark_home)
            self._wait(worker, "worker", self._worker_registered, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, role: Role, spark_home: Path) -> subprocess.Popen[bytes]:
        command = daemon_command(role, self.spec, spark_home, self.work_dir)
        proc = start_daemon(
            command,
            self.log_file(role),
            env=daemon_env(role, self.spec, spark_home, os.environ),
            cwd=self.state_dir,
        )
        ports = (
            [self.spec.master_port, self.spec.webui_port]
            if role == "master"
            else [self.spec.worker_webui_port]
        )
        self._pid_file(role).write_text(" ".join(map(str, [proc.pid, *ports])) + "\n")
        return proc

    def _worker_registered(self) -> bool:
        state = _master_json(self.spec.host, self.spec.webui_port)
        suffix = f":{self.spec.worker_webui_port}"
        return state is not None and any(
            worker.get("state") == "ALIVE" and str(worker.get("webuiaddress", "")).endswith(suffix)
            for worker in state.get("workers", [])
        )

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        role: Role,
        ready: Callable[[], bool],
        deadline: float,
    ) -> None:
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # our child: no pid-reuse question while it starts
                break
            if ready():
                return
            time.sleep(0.2)
        what = "register with the master" if role == "worker" else "start"
        ports = ", ".join(map(str, self.spec.ports().values()))
        code = proc.poll()
        why = f"it exited with status {code}" if code is not None else "it timed out"
        msg = (
            f"the Spark {role} did not {what} ({why}; ports {ports}). Operator action: read "
            f"its log {self.log_file(role)}, which ends with:\n{self.log_tail(role)}"
        )
        raise ClusterError(msg)

    def log_tail(self, role: Role, lines: int = 15) -> str:
        """The end of a daemon's log, for error messages."""
        try:
            text = self.log_file(role).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> list[Role]:
        """Stop the recorded daemons (worker first), each with its process group.

        Idempotent; a daemon that is not running is not an error. Needs no ports.

        Returns:
            The daemons that were running.
        """
        stopped: list[Role] = []
        for role in _START_ORDER[::-1]:
            pid = self._recorded(role)[0]
            if pid is not None and _pid_runs(pid, _MAIN_CLASS[role]):
                terminate(pid, _STOP_GRACE_S, group=True)
                stopped.append(role)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(role).unlink()
        return stopped[::-1]


def _master_json(host: str, webui_port: int) -> dict[str, Any] | None:
    url = f"http://{host}:{webui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            data = json.load(response)
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None
