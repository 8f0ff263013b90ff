"""A local Apache Kafka cluster: three KRaft nodes, each a broker and a controller.

``refold up --kafka-nodes 3`` starts it in place of the single broker, and a test module's
fixture starts one for the broker-loss scenarios. Every node runs from the same Maven jars as
the single broker (:mod:`refold.deploy.kafka_broker`), with its own ``node.id``, ports and log
directory ``<state dir>/kafka-cluster/node-<id>/data``, pid file ``node-<id>.pid`` ("PID PORT")
and log ``node-<id>.log``. The first start formats the nodes with one cluster id and the three
initial controllers (a dynamic KRaft quorum, KIP-853) and records them in ``cluster.json``; a
later start reads it, so the nodes keep their ids and ports. Node ``i`` (from 1) takes client
port ``first_port + i - 1`` and controller port ``first_port + nodes + i - 1``.

Topics get three replicas and ``min.insync.replicas=2``, the internal ones too
(:class:`~refold.deploy.kafka_broker.Quorum`): with ``acks=all`` an acknowledged record is on
two nodes at least, and any one node may die. Nodes are stopped by their recorded PID, never
found by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from refold.contracts.process_group import alive, start_daemon, terminate
from refold.deploy.kafka_broker import (
    MAIN_CLASS,
    BrokerError,
    Controller,
    KafkaBroker,
    Quorum,
    kafka_uuid,
)
from refold.deploy.kafka_ready import coordinators_unready

__all__ = [
    "KafkaClusterError",
    "KafkaNode",
    "LocalKafkaCluster",
    "UnderReplicated",
    "recorded_nodes",
    "under_replicated",
]

# Three JVMs starting at once on two cores: each answers in 5-15 s; a controlled shutdown
# moves its leaders away first (a few seconds).
_READY_TIMEOUT_S = 120.0
_STOP_GRACE_S = 30.0
_QUORUM_STATE = Path("__cluster_metadata-0") / "quorum-state"


def recorded_nodes(state_dir: Path) -> int:
    """How many nodes the cluster formed in ``state_dir`` has (0: none was)."""
    try:
        found = json.loads((Path(state_dir) / "kafka-cluster" / "cluster.json").read_text())
        return len(found["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class KafkaClusterError(RuntimeError):
    """The local Kafka cluster could not start, or a node of it (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class KafkaNode:
    """One node as recorded: id, client port, pid (None: no pid file), whether it runs."""

    node_id: int
    port: int
    controller_port: int
    pid: int | None
    running: bool
    log_file: Path
    data_dir: Path


@dataclass(frozen=True, slots=True)
class UnderReplicated:
    """A partition with fewer in-sync replicas than replicas (``refold status``)."""

    topic: str
    partition: int
    leader: int  # -1: none (the partition is offline)
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def __str__(self) -> str:
        leader = "no leader" if self.leader < 0 else f"leader {self.leader}"
        isr = ",".join(map(str, self.isr)) or "none"
        return f"{self.topic}/{self.partition} ({leader}, in sync {isr} of {len(self.replicas)})"


def under_replicated(bootstrap_servers: str, timeout_s: float = 5.0) -> list[UnderReplicated]:
    """Every partition with fewer in-sync replicas than replicas (internal topics too).

    From the cluster's metadata.

    Raises:
        KafkaException: No node answered within ``timeout_s``.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    metadata = admin.list_topics(timeout=timeout_s)
    return [
        UnderReplicated(name, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
        for name, topic in sorted(metadata.topics.items())
        for p in sorted(topic.partitions.values(), key=lambda p: p.id)
        if len(p.isrs) < len(p.replicas)
    ]


class LocalKafkaCluster:
    """``nodes`` combined KRaft nodes on loopback ports.

    Args:
        state_dir: The parent folder; the cluster lives in ``<state_dir>/kafka-cluster``.
        first_port: Node 1's client port; the nodes take ``2 * nodes`` consecutive ports
            (clients, then controllers). A formed cluster keeps the ports it was formed on.
        nodes: How many (3 or more: a quorum that survives the loss of one).
    """

    def __init__(self, state_dir: Path, first_port: int, nodes: int = 3) -> None:
        self.home = Path(state_dir) / "kafka-cluster"
        recorded = self._recorded_quorum()
        if recorded is not None:
            self.quorum = recorded[0]
            self.ports = recorded[1]
        else:
            if nodes < 3:
                msg = (
                    f"a Kafka cluster of {nodes} nodes survives no node's loss. Operator "
                    "action: --kafka-nodes 3 (or 1, the single broker)."
                )
                raise KafkaClusterError(msg)
            controllers = tuple(
                Controller(i + 1, first_port + nodes + i, kafka_uuid()) for i in range(nodes)
            )
            self.quorum = Quorum(kafka_uuid(), controllers)
            self.ports = tuple(first_port + i for i in range(nodes))

    @property
    def formed(self) -> bool:
        """Whether this state dir holds a cluster (formatted; it keeps its ids and ports)."""
        return (self.home / "cluster.json").is_file()

    def _recorded_quorum(self) -> tuple[Quorum, tuple[int, ...]] | None:
        try:
            found = json.loads((self.home / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        nodes = found["nodes"]
        controllers = tuple(
            Controller(n["node_id"], n["controller_port"], n["directory_id"]) for n in nodes
        )
        return Quorum(found["cluster_id"], controllers), tuple(n["port"] for n in nodes)

    def _record(self) -> None:
        nodes = [
            {
                "node_id": c.node_id,
                "port": port,
                "controller_port": c.port,
                "directory_id": c.directory_id,
            }
            for c, port in zip(self.quorum.controllers, self.ports, strict=True)
        ]
        text = json.dumps({"cluster_id": self.quorum.cluster_id, "nodes": nodes}, indent=2)
        (self.home / "cluster.json").write_text(text + "\n")

    @property
    def node_ids(self) -> list[int]:
        """Every node's id, in order."""
        return [c.node_id for c in self.quorum.controllers]

    @property
    def bootstrap_servers(self) -> str:
        """Every node, so that one that is down is no obstacle to a client's start."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def port(self, node_id: int) -> int:
        """Node ``node_id``'s client port."""
        return self.ports[self.node_ids.index(node_id)]

    def broker(self, node_id: int) -> KafkaBroker:
        """Node ``node_id`` as a :class:`KafkaBroker` (its files, config and command line)."""
        controller = self.quorum.controllers[self.node_ids.index(node_id)]
        home = self.home / f"node-{node_id}"
        return KafkaBroker(
            home, self.port(node_id), controller.port, node_id=node_id, quorum=self.quorum
        )

    def log_file(self, node_id: int) -> Path:
        """Where node ``node_id`` logs."""
        return self.home / f"node-{node_id}.log"

    def _pid_file(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}.pid"

    def pid(self, node_id: int) -> int | None:
        """The recorded pid of node ``node_id``, if any."""
        try:
            return int(self._pid_file(node_id).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def runs(self, node_id: int) -> bool:
        """Whether node ``node_id``'s recorded process runs (and is a Kafka node: PID reuse)."""
        pid = self.pid(node_id)
        if pid is None or not alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return True  # no /proc: trust the pid file
        return MAIN_CLASS.encode() in cmdline

    def status(self) -> list[KafkaNode]:
        """Each node as recorded, in id order."""
        return [
            KafkaNode(
                node_id,
                self.port(node_id),
                self.broker(node_id).controller_port,
                self.pid(node_id),
                self.runs(node_id),
                self.log_file(node_id),
                self.broker(node_id).data_dir,
            )
            for node_id in self.node_ids
        ]

    def active_controller(self) -> int | None:
        """The node that leads the KRaft quorum now, as the running nodes know it.

        Read from each running node's ``quorum-state`` file (the leader id and epoch it last
        wrote, at every election): the leader of the highest epoch, if that node runs.
        confluent-kafka has no DescribeQuorum, and in KRaft the metadata's controller id is
        any broker, not the quorum's leader.
        """
        best: tuple[int, int] | None = None  # (epoch, leader)
        for node_id in self.node_ids:
            if not self.runs(node_id):
                continue
            try:
                state = json.loads((self.broker(node_id).data_dir / _QUORUM_STATE).read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader > 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        if best is None or not self.runs(best[1]):
            return None
        return best[1]

    def start(self) -> LocalKafkaCluster:
        """Start the nodes that do not run (formatting new ones), wait until all serve.

        Raises:
            KafkaClusterError: No Java or jars, a port taken by another program, a node that
                did not start (its log is quoted) or a cluster whose coordinators did not
                answer in time. Nodes started by this call are stopped again.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        missing = [node_id for node_id in self.node_ids if not self.runs(node_id)]
        for node_id in missing:
            for port in (self.port(node_id), self.broker(node_id).controller_port):
                if _port_open(port):
                    msg = (
                        f"port {port} for Kafka node {node_id} is taken by another program. "
                        "Operator action: stop it, or choose another --kafka-port (a new "
                        "cluster takes it and the 5 ports after it)."
                    )
                    raise KafkaClusterError(msg)
        # Formatting is a JVM run each: side by side, not one after the other.
        with ThreadPoolExecutor(max_workers=len(missing) or 1) as pool:
            try:
                list(pool.map(lambda n: self.broker(n).prepare(), missing))
            except BrokerError as exc:
                raise KafkaClusterError(str(exc)) from None
        spawned: list[int] = []
        try:
            for node_id in missing:
                broker = self.broker(node_id)
                proc = start_daemon(broker.command(), self.log_file(node_id))
                self._pid_file(node_id).write_text(f"{proc.pid} {self.port(node_id)}\n")
                spawned.append(proc.pid)
            if not self.formed:
                self._record()
            self.wait_ready()
        except BaseException:
            for pid in spawned:
                terminate(pid, _STOP_GRACE_S)
            raise
        return self

    def wait_ready(self, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Wait until every running node is in the metadata and the coordinators answer.

        The coordinators as :mod:`refold.deploy.kafka_ready` asks them.

        Raises:
            KafkaClusterError: Not within ``timeout_s`` (or a node died): the node's log tail.
        """
        deadline = time.monotonic() + timeout_s
        wanted = {n for n in self.node_ids if self.runs(n)}
        seen: set[int] = set()
        while time.monotonic() < deadline:
            dead = [n for n in wanted if not self.runs(n)]
            if dead:
                msg = f"Kafka node {dead[0]} did not start; {self._tail(dead[0])}"
                raise KafkaClusterError(msg)
            seen = self._brokers_seen()
            if wanted <= seen:
                break
            time.sleep(0.2)
        else:
            late = min(wanted - seen)
            msg = (
                f"Kafka node {late} did not join the cluster within {timeout_s:.0f}s; "
                f"{self._tail(late)}"
            )
            raise KafkaClusterError(msg)
        unready = coordinators_unready({"bootstrap.servers": self.bootstrap_servers}, deadline)
        if unready is not None:
            msg = (
                f"the Kafka cluster's group or transaction coordinators did not answer within "
                f"{timeout_s:.0f}s ({unready})"
            )
            raise KafkaClusterError(msg)

    def _brokers_seen(self) -> set[int]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        try:
            return set(admin.list_topics(timeout=2).brokers)
        except Exception:  # not ready yet: KafkaException, timeouts
            return set()

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` (a crash); its pid file stays for :meth:`restart`."""
        pid = self.pid(node_id)
        if pid is not None and self.runs(node_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def restart(self, node_id: int) -> None:
        """Start node ``node_id`` again from its log directory; wait until it has rejoined."""
        broker = self.broker(node_id)
        proc = start_daemon(broker.command(), self.log_file(node_id))
        self._pid_file(node_id).write_text(f"{proc.pid} {self.port(node_id)}\n")
        self.wait_ready()

    def stop(self, node_ids: Sequence[int] | None = None) -> None:
        """Stop the recorded nodes by PID (all by default); a missing node is not an error.

        All are asked at once (SIGTERM), then each is waited for: one by one, the last nodes
        would wait for a quorum that the first ones took away.
        """
        chosen = self.node_ids if node_ids is None else list(node_ids)
        running = {n: self.pid(n) for n in chosen if self.runs(n)}
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGTERM)  # type: ignore[arg-type]
        for node_id in chosen:
            pid = running.get(node_id)
            if pid is not None:
                terminate(pid, _STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(node_id).unlink()

    def disk_use(self, node_id: int) -> int:
        """The bytes of node ``node_id``'s log directory."""
        return self.broker(node_id).disk_use()

    def _tail(self, node_id: int, lines: int = 15) -> str:
        try:
            text = self.log_file(node_id).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "no log"
        return "its log ends with:\n" + "\n".join(text)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
