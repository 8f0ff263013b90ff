"""A local Redis Cluster: 3 masters with 1 replica each, from Debian's redis-server.

``refold up --redis-cluster`` starts it in place of the single redis-server, and the test
fixtures start one for the cluster scenarios. Each node is a child process with its own folder
``<state dir>/redis-cluster/<port>/`` (``nodes.conf``, the AOF), pid file ``<port>.pid``
("PID PORT") and log ``<port>.log``. The first start forms the cluster with
``redis-cli --cluster create`` (the tool Redis ships for it, so slots and replicas are assigned
the way operators know); a later start finds ``nodes.conf`` and the nodes rejoin by themselves.
Nodes are stopped by their recorded PID, never found by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from refold.contracts.process_group import alive, start_daemon, terminate

__all__ = [
    "CLUSTER_PORTS_FROM",
    "DEFAULT_CLUSTER_PORT",
    "ClusterNode",
    "LocalRedisCluster",
    "RedisClusterError",
    "free_port_run",
]

# Six ports from here (the cluster bus takes each port + 10000).
DEFAULT_CLUSTER_PORT = 17001
# Forming takes ~1-3 s here; a failover needs the node timeout plus an election (~2-4 s).
_READY_TIMEOUT_S = 60.0
_STOP_GRACE_S = 15.0
_NODE_TIMEOUT_MS = 2000


class RedisClusterError(RuntimeError):
    """The local cluster could not start, form or stop (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node as recorded: its port, pid (None: no pid file), whether it runs, its role."""

    port: int
    pid: int | None
    running: bool
    role: str | None  # "master" | "slave" (Redis' word) | None when it does not answer
    log_file: Path


def free_port_run(count: int = 6) -> int:
    """The first of ``count`` consecutive free loopback ports whose bus ports (+10000) are free.

    For throwaway clusters (tests, benchmarks): free now, as :func:`free_port` is. The ports
    and their bus ports stay below Linux's ephemeral range (32768 up), where any outgoing
    connection may take a port between this check and the node's start. The runs are tried in
    a random order, so two processes that look at once (test workers) rarely pick the same one.
    """
    starts = range(CLUSTER_PORTS_FROM, _EPHEMERAL_FROM - _BUS_OFFSET - count, 97)
    for first in random.sample(starts, k=len(starts)):
        if all(_free(port) and _free(port + _BUS_OFFSET) for port in range(first, first + count)):
            return first
    msg = (
        f"no {count} consecutive free ports from {CLUSTER_PORTS_FROM} whose bus ports "
        f"(+{_BUS_OFFSET}) are free below {_EPHEMERAL_FROM}"
    )
    raise RedisClusterError(msg)


CLUSTER_PORTS_FROM = 21000  # free_port_run's runs start here; free_port draws below
_BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000
_EPHEMERAL_FROM = 32768  # Linux's default ip_local_port_range starts here


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        msg = (
            f"{name} is not installed. Operator action: run `make setup` (it installs "
            "redis-server and redis-tools with apt-get) or `apt-get install -y redis-server`."
        )
        raise RedisClusterError(msg)
    return found


class LocalRedisCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, on loopback.

    Args:
        state_dir: The parent folder; the cluster lives in ``<state_dir>/redis-cluster``.
        first_port: The first node's port; the nodes take ``masters * (1 + replicas)``
            consecutive ports. A formed cluster keeps the ports it was formed on.
        masters: Master count (3 is the least Redis Cluster accepts).
        replicas: Replicas per master.
        persistent: Append every write to a file (AOF, fsynced every second), as the single
            local redis-server does; throwaway clusters (tests) turn it off.
    """

    def __init__(
        self,
        state_dir: Path,
        first_port: int = DEFAULT_CLUSTER_PORT,
        *,
        masters: int = 3,
        replicas: int = 1,
        persistent: bool = True,
    ) -> None:
        self.home = Path(state_dir) / "redis-cluster"
        with contextlib.suppress(OSError, ValueError, IndexError):
            first_port = int((self.home / "formed").read_text().split()[0])
        self.first_port = first_port
        self.masters = masters
        self.replicas = replicas
        self.persistent = persistent

    @property
    def ports(self) -> list[int]:
        """Every node's port."""
        return [self.first_port + i for i in range(self.masters * (1 + self.replicas))]

    @property
    def formed(self) -> bool:
        """Whether this state dir has formed a cluster (it then rejoins on start)."""
        return (self.home / "formed").exists()

    @property
    def url(self) -> str:
        """The URL refold's clients take: every node, so one that is down is no obstacle."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _pid_file(self, port: int) -> Path:
        return self.home / f"{port}.pid"

    def log_file(self, port: int) -> Path:
        """Where node ``port`` logs."""
        return self.home / f"{port}.log"

    def pid(self, port: int) -> int | None:
        """The recorded pid of node ``port``, if any."""
        try:
            return int(self._pid_file(port).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _runs(self, port: int) -> bool:
        pid = self.pid(port)
        if pid is None or not alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return b"redis-server" in cmdline

    def node_client(self, port: int) -> redis.Redis:
        """A single-node client of node ``port`` (CLUSTER and INFO go to one node)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)

    def _role(self, port: int) -> str | None:
        try:
            with self.node_client(port) as node:
                return str(node.info("replication")["role"])
        except redis.RedisError:
            return None

    def status(self) -> list[ClusterNode]:
        """Each node as recorded, in port order."""
        return [
            ClusterNode(
                port,
                self.pid(port),
                running := self._runs(port),
                self._role(port) if running else None,
                self.log_file(port),
            )
            for port in self.ports
        ]

    def start(self) -> LocalRedisCluster:
        """Start the nodes that do not run, form the cluster if new, wait until it is ``ok``.

        Raises:
            RedisClusterError: A binary is missing, a node did not start (its log is quoted),
                or the cluster did not become ``ok`` in time. Nodes started by this call are
                stopped again.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        spawned: list[int] = []
        try:
            for port in self.ports:
                if not self._runs(port):
                    spawned.append(self._spawn(port))
            for port in self.ports:
                self._wait_answers(port)
            if not self.formed:
                self._form()
                (self.home / "formed").write_text(" ".join(map(str, self.ports)) + "\n")
            self.wait_ok()
        except BaseException:
            for pid in spawned:
                terminate(pid, _STOP_GRACE_S)
            raise
        return self

    def _spawn(self, port: int) -> int:
        folder = self.home / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            _binary("redis-server"),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)),
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(_NODE_TIMEOUT_MS), "--save", ""),
            *("--appendonly", "yes" if self.persistent else "no", "--appendfsync", "everysec"),
        ]
        proc = start_daemon(command, self.log_file(port))
        self._pid_file(port).write_text(f"{proc.pid} {port}\n")
        return proc.pid

    def _wait_answers(self, port: int) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            pid = self.pid(port)
            if pid is None or not alive(pid):
                break
            try:
                with self.node_client(port) as node:
                    node.ping()
                    return
            except redis.RedisError:
                time.sleep(0.05)
        msg = f"redis node {port} did not start; {self._tail(port)}"
        raise RedisClusterError(msg)

    def _form(self) -> None:
        """Assign the slots and replicas with ``redis-cli --cluster create``."""
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        command = [_binary("redis-cli"), "--cluster", "create", *nodes]
        command += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            command, capture_output=True, text=True, timeout=_READY_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            msg = f"redis-cli --cluster create failed:\n{done.stdout[-2000:]}{done.stderr}"
            raise RedisClusterError(msg)

    def wait_ok(self, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Wait until every running node says ``cluster_state:ok`` with all slots served.

        And until every replica's link to its master is up (synced): a master killed before
        its replica has synced has nobody to fail over to, and its slots stay down.
        """
        deadline = time.monotonic() + timeout_s
        states: list[str] = []
        while time.monotonic() < deadline:
            states = [self._state(port) for port in self.ports if self._runs(port)]
            if states and all(state.endswith(" ok") for state in states):
                return
            time.sleep(0.1)
        msg = f"the local Redis Cluster is not ok after {timeout_s:.0f} s: {', '.join(states)}"
        raise RedisClusterError(msg)

    def _state(self, port: int) -> str:
        """``"<port> ok"`` when node ``port`` serves a whole, healthy cluster, else why not."""
        try:
            with self.node_client(port) as node:
                info = node.cluster("info")
        except redis.RedisError as exc:
            return f"{port} {exc}"
        if int(info.get("cluster_slots_ok", 0)) != 16384:
            return f"{port} {info.get('cluster_slots_ok')} slots ok"
        try:
            with self.node_client(port) as node:
                replication = node.info("replication")
        except redis.RedisError as exc:
            return f"{port} {exc}"
        if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
            return f"{port} replica not synced"
        return f"{port} {info.get('cluster_state')}"

    def masters_now(self) -> list[int]:
        """The ports of the nodes that are masters now (a failover changes them)."""
        return [node.port for node in self.status() if node.role == "master"]

    def kill(self, port: int) -> None:
        """SIGKILL node ``port`` (a crash); its pid file stays for :meth:`restart`."""
        pid = self.pid(port)
        if pid is not None and self._runs(port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def restart(self, port: int) -> None:
        """Start node ``port`` again; it rejoins from its ``nodes.conf``."""
        self._spawn(port)
        self._wait_answers(port)

    def stop(self, ports: Sequence[int] | None = None) -> None:
        """Stop the recorded nodes by PID (all by default); a missing node is not an error."""
        for port in self.ports if ports is None else ports:
            pid = self.pid(port)
            if pid is not None and self._runs(port):
                terminate(pid, _STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(port).unlink()

    def _tail(self, port: int, lines: int = 15) -> str:
        try:
            text = self.log_file(port).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "no log"
        return "its log ends with:\n" + "\n".join(text)

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
