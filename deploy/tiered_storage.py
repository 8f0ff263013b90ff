"""Kafka's tiered storage (KIP-405) on the local broker: ``refold up --tiered-storage``.

The broker copies each closed segment of a tiered topic to a remote tier, and deletes it from
its own disk once the topic's ``local.retention.ms`` has passed; consumers read any offset
from the log start, remote segments included, unchanged. Locally the remote tier is Kafka's
own test plugin, ``org.apache.kafka.server.log.remote.storage.LocalTieredStorage`` (a folder
beside the broker's log), from ``org.apache.kafka:kafka-storage``'s ``test-fixtures`` jar,
which ``make setup`` fetches into ``.jars/kafka-tiered-storage`` (deploy/jars/pom.xml). The
broker loads it from ``remote.log.storage.manager.class.path``, in a class loader of its own;
it is never on the broker's class path. In production the same broker settings name a real
plugin (docs/local-broker.md, "Tiered storage").

Tiering is the cluster's, not the contract's: on a broker with a remote tier, refold creates
each topic with ``remote.storage.enable=true`` (and ``refold topics`` turns it on for existing
ones) unless it is compacted (:func:`refold.contracts.kafka.admin.tiering`), so the same
contract set runs on a broker with or without one (a broker without one refuses a topic
created with ``remote.storage.enable=true``). A segment leaves the broker's disk after the
broker's ``log.local.retention.ms`` (60 s here), or the topic's ``local.retention.ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from refold.deploy.kafka_broker import BrokerError, jars_dir, kafka_version

__all__ = [
    "LOCAL_TIERED_STORAGE",
    "TIERED_JARS_FOLDER",
    "TieredStorage",
    "plugin_jar",
]

LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
TIERED_JARS_FOLDER = "kafka-tiered-storage"  # beside the broker's jars folder (.jars/kafka)
# How often the broker copies closed segments to the remote tier, and deletes local segments
# past their local retention (Kafka's defaults: 30 s and 5 min; a local stack wants to see it).
_TASK_INTERVAL_MS = 1000
# A tiered topic's segments stay on the broker's disk this long after they were copied, unless
# the topic sets its own local.retention.ms.
_LOCAL_RETENTION_MS = 60_000


def plugin_jar() -> Path:
    """``LocalTieredStorage``'s jar, of the broker's Kafka version.

    Raises:
        BrokerError: It was not fetched (with what to run).
    """
    broker_jars = jars_dir()
    version = kafka_version(broker_jars)
    jar = broker_jars.parent / TIERED_JARS_FOLDER / f"kafka-storage-{version}-test-fixtures.jar"
    if not jar.is_file():
        msg = (
            f"Kafka's tiered-storage plugin (LocalTieredStorage) is not at {jar}. Operator "
            "action: run `make setup` (it fetches org.apache.kafka:kafka-storage:"
            f"{version}:test-fixtures with mvn from deploy/jars/pom.xml)."
        )
        raise BrokerError(msg)
    return jar


@dataclass(frozen=True, slots=True)
class TieredStorage:
    """The local broker's remote tier: a folder that ``LocalTieredStorage`` writes.

    Attributes:
        root: The remote tier (``<state dir>/kafka/remote``); its existence marks a state
            directory as tiered, so a stack first started tiered stays tiered.
    """

    root: Path

    def broker_properties(self, listener: str) -> str:
        """The ``server.properties`` lines that turn KIP-405 on.

        Args:
            listener: The listener the remote log metadata manager's clients use to reach
                the broker (its ``__remote_log_metadata`` topic).

        Raises:
            BrokerError: The plugin's jar was not fetched.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        return (
            "remote.log.storage.system.enable=true\n"
            f"remote.log.storage.manager.class.name={LOCAL_TIERED_STORAGE}\n"
            f"remote.log.storage.manager.class.path={plugin_jar()}\n"
            # LocalTieredStorage's own settings (prefix rsm.config.): its folder, kept when
            # the broker stops.
            f"rsm.config.dir={self.root}\n"
            "rsm.config.delete.on.close=false\n"
            f"remote.log.metadata.manager.listener.name={listener}\n"
            "rlmm.config.remote.log.metadata.topic.replication.factor=1\n"
            "rlmm.config.remote.log.metadata.topic.num.partitions=1\n"
            f"remote.log.manager.task.interval.ms={_TASK_INTERVAL_MS}\n"
            f"log.retention.check.interval.ms={_TASK_INTERVAL_MS}\n"
            f"log.local.retention.ms={_LOCAL_RETENTION_MS}\n"
        )

    def disk_use(self) -> int:
        """The bytes of the remote tier (0 when it does not exist)."""
        if not self.root.exists():
            return 0
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
