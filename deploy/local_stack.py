"""The embedded local stack: Apache Kafka (one KRaft node) and a redis-server as child processes.

Used by the test fixtures, the demo and ``refold up|down|status``. The broker keeps its log in
``<state dir>/kafka/data`` (:mod:`refold.deploy.kafka_broker`), so ``refold down`` and
``refold up``, a crash or a reboot keep every topic, record, group and offset; the local Redis
appends to a file (AOF) unless the stack is a throwaway one. ``redis_cluster=True``
(``refold up --redis-cluster``) starts a local Redis Cluster of 3 masters and 3 replicas in
place of the single redis-server (:mod:`refold.deploy.redis_cluster`), and ``kafka_nodes=3``
(``refold up --kafka-nodes 3``) a local Kafka cluster of three KRaft nodes in place of the single
broker (:mod:`refold.deploy.kafka_cluster`); a state dir keeps the kind of Redis and of Kafka it
was first started with.

Lifecycle contract: :meth:`LocalStack.start` writes one pid file (``<name>.pid``, "PID PORT") and
one log file per server under ``state_dir``; :meth:`LocalStack.status` reports the recorded port of
a recorded server, so a stack started on other ports is reported as it runs; :meth:`LocalStack.stop`
ends exactly the recorded PIDs (after checking that each PID still runs the program it recorded),
never processes found by name. Pid files holding only a PID (written before ports were recorded)
are still read; their server is reported on the port this ``LocalStack`` was given.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from confluent_kafka.admin import AdminClient

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.process_group import alive, start_daemon, terminate
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.deploy.kafka_broker import (
    MAIN_CLASS,
    BrokerError,
    KafkaBroker,
    jars_dir,
    java_binary,
    kafka_version,
)
from refold.deploy.kafka_cluster import KafkaClusterError, LocalKafkaCluster, recorded_nodes
from refold.deploy.kafka_ready import coordinators_unready
from refold.deploy.redis_cluster import CLUSTER_PORTS_FROM, LocalRedisCluster, RedisClusterError
from refold.deploy.stack_security import StackSecurity
from refold.deploy.tiered_storage import TieredStorage

__all__ = [
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_REDIS_PORT",
    "LocalStack",
    "LocalStackError",
    "ServerStatus",
    "free_port",
]

# Fixed defaults away from 9092/6379, so a developer's own Kafka or Redis is not disturbed.
DEFAULT_KAFKA_PORT = 19092
DEFAULT_REDIS_PORT = 16379
# Kafka answers metadata requests 3-5 s after start here (a JVM, then the KRaft controller),
# redis-server in milliseconds. A controlled shutdown of Kafka takes 2-3 s.
_READY_TIMEOUT_S = 90.0
_STOP_GRACE_S = 30.0

ServerName = Literal["kafka", "redis"]
_START_ORDER: tuple[ServerName, ...] = ("redis", "kafka")


class LocalStackError(RuntimeError):
    """The local stack could not be started, stopped or inspected."""


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What ``refold status`` reports for one server."""

    name: ServerName | Literal["schema-registry"]  # the registry: deploy/schema_registry.py
    port: int
    pid: int | None
    running: bool
    log_file: Path
    data_dir: Path | None = None
    disk_bytes: int = 0
    version: str = ""
    node_id: int | None = None  # a node of a local Kafka cluster (deploy/kafka_cluster.py)


# free_port draws from here: below the Redis Cluster runs' ports (deploy/redis_cluster.py) and
# below Linux's ephemeral range (32768 up). A port the kernel picks (bind to port 0) is in that
# range, where any outgoing connection's local end may take it between the pick and the
# server's bind, seconds later for a JVM: a Spark worker's UI failed so beside tests full of
# Kafka clients. Below it, only another listener can.
_FREE_PORTS = range(12000, CLUSTER_PORTS_FROM)


def free_port() -> int:
    """Return a loopback TCP port that is free right now, from a range clients do not use.

    Tried in a random order, so that two processes that look at once (test workers) rarely
    pick the same one; on a machine where all those tried are taken, the kernel's choice.
    """
    for port in random.sample(_FREE_PORTS, k=64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until every thread of ``pid`` is stopped (state T in /proc; no /proc: return)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            states = [
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                for task in Path(f"/proc/{pid}/task").iterdir()
            ]
        except (OSError, IndexError):
            return  # gone, or no /proc to look at
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)


def _installed_kafka_version() -> str:
    try:
        return kafka_version(jars_dir())
    except BrokerError:
        return "(jars missing)"


def _pid_runs(pid: int, program: str) -> bool:
    """True if ``pid`` is alive and its command line mentions ``program`` (guards PID reuse)."""
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return True  # no /proc: trust the pid file
    return program in cmdline


def _kafka_cluster(
    state_dir: Path, kafka_port: int, kafka_nodes: int | None
) -> LocalKafkaCluster | None:
    """The stack's Kafka cluster (``None``: a single broker); a state dir keeps its kind."""
    recorded = recorded_nodes(state_dir)
    single = (state_dir / "kafka" / "data" / "meta.properties").is_file()
    was = recorded or (1 if single else None)  # None: a new stack
    wanted = (was or 1) if kafka_nodes is None else kafka_nodes
    if was is not None and was != wanted:
        kind = "a single broker" if was == 1 else f"a {was}-node Kafka cluster"
        msg = (
            f"{state_dir} holds {kind}'s log, not --kafka-nodes {wanted}. Operator action: "
            "`refold up` without --kafka-nodes (as it was first started), or another state dir."
        )
        raise LocalStackError(msg)
    if wanted == 1:
        return None
    try:
        return LocalKafkaCluster(state_dir, kafka_port, wanted)
    except KafkaClusterError as exc:
        raise LocalStackError(str(exc)) from None


def _redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        msg = (
            "redis-server is not installed. Operator action: run `make setup` "
            "(it installs it with apt-get) or `apt-get install -y redis-server`."
        )
        raise LocalStackError(msg)
    return found


class LocalStack:
    """Apache Kafka and a redis-server on loopback ports, with pid and log files.

    Args:
        state_dir: Directory for pid files, logs, the broker's log (``kafka/data``) and
            Redis' working directory.
        kafka_port: Loopback port of the broker.
        redis_port: Loopback port of redis-server.
        redis_persistent: Redis appends every write to a file (AOF, fsynced every second).
        secure: SASL/SCRAM on a TLS listener and a Redis ACL user
            (:mod:`refold.deploy.stack_security`).
            ``None``: as the state dir was first started (a secured stack stays secured).
        redis_cluster: A local Redis Cluster (3 masters, 1 replica each, on ``redis_port``
            and the 5 ports after it) instead of one redis-server. ``None``: as the state dir
            was first started.
        tiered_storage: The broker tiers to a local remote tier (KIP-405,
            :mod:`refold.deploy.tiered_storage`). ``None``: as the state dir was first started.
        kafka_nodes: 1, a single broker; 3, a local Kafka cluster of three KRaft nodes
            (:mod:`refold.deploy.kafka_cluster`) on ``kafka_port`` and the 5 ports after it.
            ``None``: as the state dir was first started.
    """

    def __init__(
        self,
        state_dir: Path,
        kafka_port: int = DEFAULT_KAFKA_PORT,
        redis_port: int = DEFAULT_REDIS_PORT,
        *,
        redis_persistent: bool = True,
        secure: bool | None = None,
        redis_cluster: bool | None = None,
        tiered_storage: bool | None = None,
        kafka_nodes: int | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.kafka_cluster = _kafka_cluster(self.state_dir, kafka_port, kafka_nodes)
        cluster = LocalRedisCluster(self.state_dir, redis_port, persistent=redis_persistent)
        if redis_cluster is None:
            redis_cluster = cluster.formed
        self.cluster = cluster if redis_cluster else None
        secrets = self.state_dir / "secrets"
        if secure is None:
            secure = (secrets / "credentials.json").is_file()
        self.security = StackSecurity(secrets, java_binary()) if secure else None
        self.kafka_port = kafka_port
        self.redis_port = redis_port
        # Redis holds what the log cannot rebuild (API keys, webhook positions): by default it
        # appends every write to a file under the state dir, fsynced every second (AOF
        # everysec), so a restart or a kill -9 loses at most the last second. Throwaway stacks
        # (the test session, benchmarks, fault tests that restore RDB files) turn it off.
        self.redis_persistent = redis_persistent
        remote = TieredStorage(self.state_dir / "kafka" / "remote")
        if tiered_storage is None:
            tiered_storage = remote.root.is_dir()
        self.tiered = remote if tiered_storage else None
        for option, kind in (("--redis-cluster", self.cluster), ("--tiered-storage", self.tiered)):
            if kind is not None and self.security is not None:
                msg = (
                    f"a secured stack with {option} is not supported yet. Operator action: "
                    f"choose one of --secure and {option} (or another state dir)."
                )
                raise LocalStackError(msg)
        if self.kafka_cluster is not None and (self.security or self.tiered):
            msg = (
                "a local Kafka cluster (--kafka-nodes 3) with --secure or --tiered-storage is "
                "not supported yet. Operator action: choose one (or another state dir)."
            )
            raise LocalStackError(msg)
        # The servers this stack runs itself: the clusters' nodes are the clusters'.
        clustered: dict[ServerName, object] = {"redis": self.cluster, "kafka": self.kafka_cluster}
        self._servers: tuple[ServerName, ...] = tuple(
            name for name in _START_ORDER if clustered[name] is None
        )

    @property
    def bootstrap_servers(self) -> str:
        """The broker address for Kafka clients (every node's, on a cluster)."""
        if self.kafka_cluster is not None:
            return self.kafka_cluster.bootstrap_servers
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        """The URL of the redis-server (or of the cluster) for refold's clients."""
        if self.cluster is not None:
            return self.cluster.url
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _pid_file(self, name: ServerName) -> Path:
        return self.state_dir / f"{name}.pid"

    def _log_file(self, name: ServerName) -> Path:
        return self.state_dir / f"{name}.log"

    def _port(self, name: ServerName) -> int:
        return self.kafka_port if name == "kafka" else self.redis_port

    def _recorded(self, name: ServerName) -> tuple[int | None, int | None]:
        """The pid file's ``(pid, port)``; port None in an old pid file holding only a pid."""
        try:
            words = self._pid_file(name).read_text().split()
            pid = int(words[0])
        except (OSError, ValueError, IndexError):
            return None, None
        try:
            return pid, int(words[1])
        except (ValueError, IndexError):
            return pid, None

    def _recorded_pid(self, name: ServerName) -> int | None:
        return self._recorded(name)[0]

    def kafka_settings(self) -> KafkaSettings:
        """Client settings for this stack's broker (with the credentials when secured)."""
        if self.security is None:
            return KafkaSettings(bootstrap_servers=self.bootstrap_servers)
        return self.security.kafka_settings(self.bootstrap_servers)

    def redis_settings(self, key_prefix: str = DEFAULT_KEY_PREFIX) -> RedisSettings:
        """Client settings for this stack's redis-server (with the ACL user when secured)."""
        if self.security is None:
            return RedisSettings(url=self.redis_url, key_prefix=key_prefix)
        return self.security.redis_settings(self.redis_url, key_prefix)

    def _broker(self, controller_port: int = 0) -> KafkaBroker:
        home = self.state_dir / "kafka"
        return KafkaBroker(home, self.kafka_port, controller_port, self.security, self.tiered)

    def _command(self, name: ServerName) -> list[str]:
        if name == "kafka":
            broker = self._broker(free_port())
            try:
                broker.prepare()
            except BrokerError as exc:
                raise LocalStackError(str(exc)) from None
            return broker.command()
        return [
            _redis_binary(),
            "--port",
            str(self.redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.redis_persistent else "no",
            "--appendfsync",
            "everysec",
            "--dir",
            str(self.state_dir),
            *(self.security.redis_arguments() if self.security else []),
        ]

    def _program(self, name: ServerName) -> str:
        return MAIN_CLASS if name == "kafka" else "redis-server"

    def status(self) -> list[ServerStatus]:
        """Report each server's recorded pid and port, and whether it still runs.

        Returns:
            Kafka then Redis. The port is the one recorded when the server was started, or this
            stack's own port when nothing (or a pid file without a port) was recorded.
        """
        result = []
        for name in self._servers[::-1]:
            pid, port = self._recorded(name)
            running = pid is not None and _pid_runs(pid, self._program(name))
            status = ServerStatus(
                name,
                port if port is not None else self._port(name),
                pid,
                running,
                self._log_file(name),
            )
            if name == "kafka":
                broker = self._broker()
                status = ServerStatus(
                    *(status.name, status.port, status.pid, status.running, status.log_file),
                    data_dir=broker.data_dir,
                    disk_bytes=broker.disk_use(),
                    version=_installed_kafka_version(),
                )
            result.append(status)
        for node in self.cluster.status() if self.cluster is not None else []:
            result.append(ServerStatus("redis", node.port, node.pid, node.running, node.log_file))
        if self.kafka_cluster is not None:  # its nodes first, where the broker would be
            result[:0] = [
                ServerStatus(
                    *("kafka", node.port, node.pid, node.running, node.log_file, node.data_dir),
                    disk_bytes=self.kafka_cluster.disk_use(node.node_id),
                    version=_installed_kafka_version(),
                    node_id=node.node_id,
                )
                for node in self.kafka_cluster.status()
            ]
        return result

    def start(self, *, missing_only: bool = False) -> LocalStack:
        """Start both servers and wait until they accept connections.

        Args:
            missing_only: Start only the servers that do not run (``refold up`` after one of
                them died); the running ones are left alone. Otherwise a running one is an
                error.

        Raises:
            LocalStackError: A server runs already (unless ``missing_only``), a port is taken
                by another program, a binary is missing, or a server did not become ready (its
                log file is named in the message). Servers started by this call are stopped.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self.security.ensure()
        missing: list[ServerName] = []
        for server in self.status():
            if server.name not in self._servers:
                continue  # a cluster node: the cluster starts what is missing of it
            if server.running and missing_only:
                continue
            if server.running:
                msg = (
                    f"{server.name} is already running (pid {server.pid}, port {server.port}). "
                    "Operator action: `refold down` first, or use it as it is."
                )
                raise LocalStackError(msg)
            missing.append(server.name)
            port = self._port(server.name)
            if _port_open(port):
                msg = (
                    f"port {port} for {server.name} is taken by another program. "
                    "Operator action: stop it, or choose other ports with "
                    "REFOLD_KAFKA_PORT / REFOLD_REDIS_PORT."
                )
                raise LocalStackError(msg)
        starting = [name for name in _START_ORDER if name in missing]
        spawned: dict[ServerName, int] = {}
        try:
            for name in starting:
                spawned[name] = self._spawn(name)
            for name in starting:
                try:
                    self._wait_ready(name)
                except LocalStackError:
                    if name != "kafka" or not self._lost_a_port(name):
                        raise
                    # The controller's port was free when chosen and taken (by another
                    # test worker's server) before the broker bound it: once more, another.
                    terminate(spawned.pop(name), _STOP_GRACE_S)
                    spawned[name] = self._spawn(name)
                    self._wait_ready(name)
            if self.kafka_cluster is not None:
                self.kafka_cluster.start()  # the nodes that do not run
            if self.cluster is not None:
                self.cluster.start()
        except (RedisClusterError, KafkaClusterError) as exc:
            self._stop_spawned(spawned)
            raise LocalStackError(str(exc)) from None
        except BaseException:
            self._stop_spawned(spawned)
            raise
        return self

    def _lost_a_port(self, name: ServerName) -> bool:
        """Whether the server's log says a port it was to bind was taken meanwhile."""
        try:
            return "Address already in use" in self._log_file(name).read_text(errors="replace")
        except OSError:
            return False

    def _stop_spawned(self, spawned: dict[ServerName, int]) -> None:
        # Our own children, unreaped: no PID reuse to guard against, so no look at their
        # command line (a redis-server rewriting its title had none to match for a moment,
        # and was left running).
        for name, pid in reversed(spawned.items()):
            terminate(pid, _STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(name).unlink()

    def _spawn(self, name: ServerName) -> int:
        command = self._command(name)
        proc = start_daemon(command, self._log_file(name))
        # The port too, so `refold status` and `down` need not be told it again.
        self._pid_file(name).write_text(f"{proc.pid} {self._port(name)}\n")
        return proc.pid

    def _wait_ready(self, name: ServerName) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        pid = self._recorded_pid(name)
        while time.monotonic() < deadline:
            if pid is None or not alive(pid):
                break
            if _port_open(self._port(name)) and (name == "redis" or self._kafka_answers()):
                if name == "kafka":
                    self._wait_coordinators(deadline)
                return
            time.sleep(0.05)
        tail = self._log_tail(name)
        msg = f"{name} did not start on port {self._port(name)}; its log ends with:\n{tail}"
        raise LocalStackError(msg)

    def _wait_coordinators(self, deadline: float) -> None:
        """Return once the broker's group and transaction coordinators answer (kafka_ready)."""
        unready = coordinators_unready(self.kafka_settings().as_librdkafka(), deadline)
        if unready is None:
            return
        msg = (
            f"kafka answers on port {self._port('kafka')}, but its group or transaction "
            f"coordinator did not within {_READY_TIMEOUT_S:.0f}s ({unready}); its log ends "
            f"with:\n{self._log_tail('kafka')}"
        )
        raise LocalStackError(msg)

    def _kafka_answers(self) -> bool:
        """The broker serves metadata with itself in it (the listener opens a bit earlier)."""
        admin = AdminClient({**self.kafka_settings().as_librdkafka(), "log_level": 0})
        try:
            return bool(admin.list_topics(timeout=2).brokers)
        except Exception:  # not ready yet: KafkaException, timeouts
            return False

    def _log_tail(self, name: ServerName, lines: int = 15) -> str:
        try:
            return "\n".join(self._log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- fault injection (the fault suite): one server at a time, by its recorded pid ------

    def kill(self, name: ServerName) -> None:
        """SIGKILL one server (a crash); its pid file stays for :meth:`restart`."""
        pid = self._recorded_pid(name)
        if pid is not None and _pid_runs(pid, self._program(name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def restart(self, name: ServerName) -> None:
        """Start one server again on its port (Redis loads ``dump.rdb`` from the state dir)."""
        self._spawn(name)
        self._wait_ready(name)

    def pause(self, name: ServerName, paused: bool = True) -> None:
        """SIGSTOP (or SIGCONT) one server: it keeps its sockets but answers nothing.

        Returns once every thread of it has stopped: kill() returns before a busy thread does,
        and a JVM's network thread answered a request in that window (a fault test saw four
        events acknowledged by a broker it had just paused).
        """
        pid = self._recorded_pid(name)
        if pid is not None and _pid_runs(pid, self._program(name)):
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)
            if paused:
                _wait_stopped(pid)

    def stop(self) -> None:
        """Stop the servers this stack recorded, by PID; a missing server is not an error.

        Idempotent. Needs no ports: the pid files say what was started, whatever ports this
        ``LocalStack`` was given.
        """
        self._stop(_START_ORDER)
        if self.cluster is not None:
            self.cluster.stop()
        if self.kafka_cluster is not None:
            self.kafka_cluster.stop()

    def _stop(self, names: Sequence[ServerName]) -> None:
        for name in [n for n in _START_ORDER[::-1] if n in names]:
            pid = self._recorded_pid(name)
            if pid is not None and _pid_runs(pid, self._program(name)):
                terminate(pid, _STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(name).unlink()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
