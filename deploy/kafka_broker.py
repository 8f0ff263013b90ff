"""Apache Kafka as the local broker: a KRaft node (broker and controller in one JVM).

Its jars come from Maven (``deploy/jars/pom.xml``, fetched by ``make setup`` into ``.jars/kafka``
or the folder ``REFOLD_KAFKA_JARS`` names); there is no tarball and no script of Kafka's. The
log lives in a data directory under the stack's state directory, formatted on the first start
(``kafka.tools.StorageTool format``), so a stop and a start keep every topic, record, consumer
group and offset. :class:`~refold.deploy.local_stack.LocalStack` starts and stops the process
(:class:`~refold.deploy.kafka_cluster.LocalKafkaCluster` those of a cluster's nodes, each a
:class:`KafkaBroker` of one :class:`Quorum`); this module says how: the configuration files,
the storage format and the command line.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refold.deploy.stack_security import StackSecurity
    from refold.deploy.tiered_storage import TieredStorage

__all__ = [
    "KAFKA_JARS_ENV",
    "BrokerError",
    "Controller",
    "KafkaBroker",
    "Quorum",
    "jars_dir",
    "java_binary",
    "kafka_uuid",
    "kafka_version",
]

KAFKA_JARS_ENV = "REFOLD_KAFKA_JARS"
MAIN_CLASS = "kafka.Kafka"  # also what identifies the broker's process in /proc/<pid>/cmdline
_FORMAT_TIMEOUT_S = 120.0
_HEAP = ("-Xms256m", "-Xmx768m")

# One node, or one of a cluster's (:class:`Quorum`). Topics are created by refold from its topic
# specs, never on first use (auto-creation would hide a typo in a topic name).
_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.listener.names=CONTROLLER
log.dirs={log_dir}
auto.create.topics.enable=false
num.partitions=1
offsets.topic.num.partitions=8
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
"""
# How many copies of every topic, internal ones included: on a single node one; on a cluster
# three (or its size), and a write is acknowledged (acks=all) once two of them have it, so
# losing any one node loses no acknowledged record and refuses no write.
_REPLICATION = """\
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
"""
_PLAINTEXT_LISTENERS = """\
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
"""

# Warnings and errors only, plus the line that says the server started; into the broker's log
# file (stdout is redirected there).
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{ISO8601} %p [%c{1}] %m%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


class BrokerError(RuntimeError):
    """Apache Kafka cannot be started here: no Java, no jars, or a data directory it refuses."""


def jars_dir() -> Path:
    """Where Apache Kafka's jars are: ``REFOLD_KAFKA_JARS``, else ``.jars/kafka`` of the checkout.

    Raises:
        BrokerError: The folder holds no Kafka jar (with what to run).
    """
    configured = os.environ.get(KAFKA_JARS_ENV)
    folder = Path(configured) if configured else Path(__file__).resolve().parents[1] / ".jars/kafka"
    if not any(folder.glob("kafka_2.13-*.jar")):
        msg = (
            f"Apache Kafka's jars are not in {folder}. Operator action: run `make setup` (it "
            f"fetches them with mvn from deploy/jars/pom.xml), or set {KAFKA_JARS_ENV} to a "
            "folder that holds them."
        )
        raise BrokerError(msg)
    return folder


def java_binary() -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on the PATH.

    Raises:
        BrokerError: There is none (Kafka 4 needs Java 17 or newer).
    """
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        msg = (
            "Java is not installed: Apache Kafka needs Java 17 or newer. Operator action: "
            "`apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME."
        )
        raise BrokerError(msg)
    return found


def kafka_version(folder: Path) -> str:
    """The Kafka version of the jars in ``folder`` (from ``kafka_2.13-<version>.jar``)."""
    for jar in sorted(folder.glob("kafka_2.13-*.jar")):
        found = re.fullmatch(r"kafka_2\.13-(.+)\.jar", jar.name)
        if found:
            return found.group(1)
    return "unknown"


def kafka_uuid() -> str:
    """A new Kafka id (a cluster's, a log directory's), as ``kafka-storage random-uuid``.

    16 random bytes, URL-safe base64 without padding (22 characters).
    """
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Controller:
    """One voter of a KRaft quorum: its node id, controller port and metadata directory id."""

    node_id: int
    port: int
    directory_id: str


@dataclass(frozen=True, slots=True)
class Quorum:
    """The nodes of a local cluster, all of them brokers and controllers (a dynamic quorum).

    Every node is formatted with the same cluster id and the same initial controllers
    (``kafka-storage format --initial-controllers``, KIP-853), and finds the quorum through
    ``controller.quorum.bootstrap.servers``: the voters are then in the metadata log, so their
    controller ports are fixed once formatted.
    """

    cluster_id: str
    controllers: tuple[Controller, ...]

    @property
    def replicas(self) -> int:
        """Copies of each topic: three (or fewer nodes' worth)."""
        return min(3, len(self.controllers))

    @property
    def min_insync(self) -> int:
        """Copies a write needs before it is acknowledged (acks=all): a majority of three."""
        return max(1, self.replicas - 1)

    def properties(self) -> str:
        """The quorum's and the replication's lines of every node's ``server.properties``."""
        servers = ",".join(f"127.0.0.1:{c.port}" for c in self.controllers)
        return f"controller.quorum.bootstrap.servers={servers}\n" + _REPLICATION.format(
            replicas=self.replicas, min_isr=self.min_insync
        )

    def format_arguments(self) -> list[str]:
        """The cluster id and the initial controllers, for ``StorageTool format``."""
        voters = ",".join(
            f"{c.node_id}@127.0.0.1:{c.port}:{c.directory_id}" for c in self.controllers
        )
        return [f"--cluster-id={self.cluster_id}", f"--initial-controllers={voters}"]


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """One single-node Apache Kafka: its files under ``home`` and its two loopback ports.

    Attributes:
        home: The broker's folder: ``server.properties``, ``log4j2.properties`` and ``data/``.
        port: The client listener.
        controller_port: The KRaft controller listener (chosen afresh at each start).
        security: SASL/SCRAM on a TLS client listener (:mod:`refold.deploy.stack_security`);
            ``None`` for a PLAINTEXT one.
        tiered: A remote tier (KIP-405, :mod:`refold.deploy.tiered_storage`); ``None``:
            none. Only with a PLAINTEXT listener.
        node_id: Its ``node.id``.
        quorum: The cluster it is a node of (:mod:`refold.deploy.kafka_cluster`); ``None``: a
            single node, its own quorum.
    """

    home: Path
    port: int
    controller_port: int
    security: StackSecurity | None = None
    tiered: TieredStorage | None = None
    node_id: int = 1
    quorum: Quorum | None = None

    @property
    def data_dir(self) -> Path:
        """The log: every topic's partitions and the cluster's metadata."""
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        """The broker's ``server.properties`` (written at each start)."""
        return self.home / "server.properties"

    @property
    def log_config_file(self) -> Path:
        """Its Log4j2 configuration (warnings, errors and the start line)."""
        return self.home / "log4j2.properties"

    def prepare(self) -> None:
        """Write the configuration, and format the data directory if it is new.

        Raises:
            BrokerError: No Java or jars, or a data directory that is not Kafka's (with what
                to do), or the format failed.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        ports = {"port": self.port, "controller_port": self.controller_port}
        if self.security is None:
            listeners = _PLAINTEXT_LISTENERS.format(**ports)
        else:
            self.security.ensure()
            listeners = self.security.broker_properties(**ports)
        if self.tiered is not None:
            listeners += self.tiered.broker_properties("PLAINTEXT")
        # Only its owner reads it: the secured broker's holds its store passwords.
        self.config_file.touch(mode=0o600)
        self.config_file.chmod(0o600)
        if self.quorum is None:
            quorum = f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}\n"
            quorum += _REPLICATION.format(replicas=1, min_isr=1)
        else:
            quorum = self.quorum.properties()
        common = _PROPERTIES.format(log_dir=self.data_dir, node_id=self.node_id)
        self.config_file.write_text(common + quorum + listeners)
        self.log_config_file.write_text(_LOG4J2)
        meta = self.data_dir / "meta.properties"
        secured = self.home / "formatted-secured"  # the SCRAM credential is in the storage
        if meta.is_file() and self.security is not None and not secured.is_file():
            msg = (
                f"Kafka's storage in {self.data_dir} was formatted without --secure, so it has "
                "no SCRAM credential. Operator action: `refold down`, move the state directory "
                "away and `refold up --secure` (a new, empty log), or `refold up` without it."
            )
            raise BrokerError(msg)
        if meta.is_file():
            if "cluster.id=" not in meta.read_text(errors="replace"):
                msg = (
                    f"Kafka's data directory {self.data_dir} is corrupt ({meta.name} has no "
                    "cluster id). Operator action: `refold down`, move the directory away "
                    "(its log is then lost; replay rebuilds state from a log you restore), and "
                    "`refold up` to format a new one."
                )
                raise BrokerError(msg)
            return
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            msg = (
                f"{self.data_dir} is not empty but was never formatted for Kafka (no "
                "meta.properties). Operator action: move it away, then `refold up`."
            )
            raise BrokerError(msg)
        # `--cluster-id=<id>` in one word: an id that starts with "-" would read as an option.
        command = [*self._java(), "kafka.tools.StorageTool", "format"]
        if self.quorum is None:
            command.append(f"--cluster-id={kafka_uuid()}")
        else:
            command += self.quorum.format_arguments()
        command += ["--config", str(self.config_file)]
        if self.security is not None:
            command += self.security.format_arguments()
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            command, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            msg = f"formatting Kafka's storage in {self.data_dir} failed: {done.stderr[-2000:]}"
            raise BrokerError(msg)
        if self.security is not None:
            secured.touch()

    def command(self) -> list[str]:
        """The broker's command line (after :meth:`prepare`)."""
        return [*self._java(*_HEAP), MAIN_CLASS, str(self.config_file)]

    def _java(self, *options: str) -> list[str]:
        return [
            java_binary(),
            *options,
            f"-Dlog4j2.configurationFile={self.log_config_file}",
            "-cp",
            f"{jars_dir()}/*",
        ]

    def disk_use(self) -> int:
        """The bytes of the data directory (0 when it does not exist)."""
        if not self.data_dir.exists():
            return 0
        # Blocks, not sizes: Kafka preallocates sparse 10 MB index files.
        return sum(f.stat().st_blocks * 512 for f in self.data_dir.rglob("*") if f.is_file())
