"""The engines of ``python -m bench peers``: how each is started, and where its states end up.

Every engine folds the same backlog into order_state's per-key state with the same rules, each
decoding as its users would (the Python peers: fastavro with the schemas parsed once,
:class:`bench.peers.report.OrderFold`; the JVM peers: Avro's Java library on the same
schemas). Two processes (or threads, for the JVM peers) each: the machine's two cores. A Redis
variant writes each new state to Redis with a pipeline, as refold's processor and baseline do
(they write in exactly-once transactions).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.backlog import ORDERS_TOPIC
from bench.peers.oracle import changelog_states, merged_states, redis_states
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.local_stack import free_port
from refold.processors.fold.projection import State
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.runtime.envelope import FoldTarget

__all__ = ["ENGINES", "NOTIFICATIONS", "Engine", "Job", "spark_processor"]

ROOT = Path(__file__).parent.parent.parent
NOTIFICATIONS = f"{ORDERS_TOPIC.name}.notifications"  # refold's shipping notices
_PROCESSES = 2
_BASELINE = "bench.peers.baseline_peer"
_JVM = ROOT / "bench" / "peers" / "jvm"
_SCHEMAS = str(ROOT / "refold" / "contracts" / "schemas" / "commerce")
# Warnings of the JVM peers to their logs; Flink's serializers reach into the JDK's collections
# (as its own launch scripts allow).
_JVM_FLAGS = [
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    *(
        f"--add-opens=java.base/{package}=ALL-UNNAMED"
        for package in ("java.lang", "java.util", "java.lang.reflect", "java.io", "java.nio")
    ),
]


@dataclass
class Job:
    """The backlog every engine folds, and where the engines write."""

    bootstrap: str
    redis_url: str
    topic: str
    ends: Mapping[tuple[str, int], int]
    events: int
    work: Path
    expected: dict[str, State] = field(default_factory=dict)
    run: str = ""  # suffix of the consumer groups: a run of its own on a log already folded
    java_heap: str = "2g"  # the JVM peers' -Xmx, as refold's driver (spark.driver.memory)
    tail: bool = False  # read on at the log's end until stopped (the latency run)

    @property
    def partition_ends(self) -> dict[int, int]:
        """Log end per partition."""
        return {p: e for (_t, p), e in self.ends.items()}

    def args(self, name: str, index: int) -> list[str]:
        """The flags every peer takes (bench/peers/args.py), for process ``index`` of ``name``."""
        ends = ",".join(f"{p}:{e}" for p, e in sorted(self.partition_ends.items()))
        return [
            "--bootstrap", self.bootstrap, "--topic", self.topic, "--ends", ends,
            "--progress", str(self.work / name / f"progress-{index}.json"),
            "--work-dir", str(self.work / name), "--group", f"peers-{name}{self.run}",
            "--process-id", str(index), "--tail", "true" if self.tail else "false",
        ]  # fmt: skip

    def refold_states(self, base: str) -> dict[str, Any]:
        """The order states refold wrote into a generation (``base``: its key prefix)."""
        return redis_states(redis_client(self.redis_url), f"{base}:t:orders")


def _peers_python() -> str:
    return os.environ.get("REFOLD_PEERS_PYTHON", str(ROOT / ".venv-peers" / "bin" / "python"))


@dataclass(frozen=True)
class Engine:
    """One engine of the table: its name, label, what it guarantees, how it runs."""

    name: str
    label: str
    guarantee: str
    module: str = ""  # a Python peer's module (bench.peers.*), run in .venv-peers
    redis: bool = False
    java: str = ""  # a JVM peer's class (bench/peers/<class>.java) and .jars/ folder
    jars: str = ""
    prepare: Callable[[Job, Path], list[str]] | None = None  # extra flags per process
    ends_itself: bool = False  # a bounded job: it ends at the log's end
    changelog: bool = False  # its states are read from its store's changelogs (Quix Streams)

    @property
    def redis_prefix(self) -> str:
        """Where a Redis variant writes (refold's baseline: its keys' prefix)."""
        return "peers-baseline" if self.module == _BASELINE else f"peers:{self.name}"

    def missing(self, job: Job) -> str:
        """Why this engine cannot run here ("" when it can)."""
        del job
        if self.module and self.module != _BASELINE and not Path(_peers_python()).exists():
            return "not installed (.venv-peers: make setup)"
        if self.java and not any((ROOT / ".jars" / self.jars).glob("*.jar")):
            return f"not installed (.jars/{self.jars}: make setup)"
        if self.java and shutil.which("javac") is None:
            return "no javac (a JDK: apt-get install openjdk-17-jdk-headless)"
        return ""

    def _argv(self, job: Job) -> list[str]:
        if self.java:
            classes = job.work / f"classes-{self.jars}"
            classpath = f"{classes}:{ROOT / '.jars' / self.jars}/*"
            if not (classes / f"{self.java}.class").exists():
                javac = shutil.which("javac") or "javac"  # checked by missing()
                sources = [str(_JVM / "OrderFold.java"), str(_JVM / f"{self.java}.java")]
                subprocess.run(
                    [javac, "-nowarn", "-d", str(classes), "-cp", classpath, *sources],
                    check=True,
                )
            java = shutil.which("java") or "java"
            return [
                java,
                f"-Xmx{job.java_heap}",
                *_JVM_FLAGS,
                "-cp",
                classpath,
                self.java,
                "--schemas",
                _SCHEMAS,
            ]
        baseline = self.module == _BASELINE
        return [sys.executable if baseline else _peers_python(), "-m", self.module]

    def processes(self, job: Job) -> tuple[list[GroupProcess], list[Path]]:
        """The processes to start, and their progress files."""
        folder = job.work / self.name
        folder.mkdir(parents=True, exist_ok=True)
        count = 1 if self.java or self.module == _BASELINE else _PROCESSES
        extra = self.prepare(job, folder) if self.prepare is not None else []
        out, progress = [], []
        for index in range(count):
            argv = [*self._argv(job), *job.args(self.name, index), *extra]
            if self.redis:
                argv += ["--redis-url", job.redis_url, "--redis-prefix", self.redis_prefix]
            else:
                argv += ["--states", str(folder / f"states-{index}.json")]
            env = {"PYTHONPATH": str(ROOT)}
            out.append(GroupProcess(argv, env, job.work / "logs" / f"{self.name}-{index}.log"))
            progress.append(folder / f"progress-{index}.json")
        return out, progress

    def states(self, job: Job) -> dict[str, Any]:
        """The engine's final states."""
        if self.module == _BASELINE:
            kafka = (("bootstrap.servers", job.bootstrap),)
            target = FoldTarget(
                "order_state", 1, job.redis_url, self.redis_prefix, kafka, f"{job.topic}.dlq"
            )
            return job.refold_states(target.keys.base)
        if self.redis:
            return redis_states(redis_client(job.redis_url), self.redis_prefix)
        if self.changelog:
            return changelog_states(job.bootstrap, f"peers-{self.name}{job.run}")
        return merged_states(sorted((job.work / self.name).glob("states-*.json")))


def _baseline(job: Job, folder: Path) -> list[str]:
    del folder
    return ["--processes", str(_PROCESSES)]


def _bytewax(job: Job, folder: Path) -> list[str]:
    """Two processes' addresses (a Bytewax cluster of one worker per process)."""
    del job, folder
    return ["--addresses", ",".join(f"127.0.0.1:{free_port()}" for _ in range(_PROCESSES))]


def _bytewax_recovery(job: Job, folder: Path) -> list[str]:
    """:func:`_bytewax`, and Bytewax's recovery store (one SQLite file per process)."""
    recovery = folder / "recovery"
    recovery.mkdir(exist_ok=True)
    subprocess.run(
        [_peers_python(), "-m", "bytewax.recovery", str(recovery), str(_PROCESSES)], check=True
    )
    return _bytewax(job, folder)


def spark_processor(
    job: Job, prefix: str, log: str, *, available_now: bool, **options: str
) -> tuple[GroupProcess, GenerationRegistry]:
    """refold's order_state processor (not started) on the job's topic, under ``prefix``.

    The peers' job: no status-change stream (no peer publishes one), as in make bench.
    """
    launcher = ProcessLauncher(
        KafkaSettings(bootstrap_servers=job.bootstrap),
        RedisSettings(url=job.redis_url, key_prefix=prefix),
        SparkSettings(),
        job.work / prefix,
        {
            "order_state": OrderStateOptions(
                topics=[job.topic],
                dead_letter_topic=f"{job.topic}.dlq",
                notifications_topic=NOTIFICATIONS,
                changes_topic="",
                **options,
            )
        },
    )
    registry = GenerationRegistry.of(redis_client(job.redis_url), "order_state", prefix)
    process = GroupProcess(
        launcher.argv(["order_state"], available_now=available_now),
        launcher.env(),
        job.work / "logs" / log,
    )
    return process, registry


_EOS = "exactly once"
ENGINES: tuple[Engine, ...] = (
    Engine(
        "refold-spark",
        "refold Spark processor",
        f"{_EOS}: state, positions and batch id in one Redis transaction; online replay",
    ),
    Engine(
        "refold-baseline",
        "refold plain-Python baseline",
        f"{_EOS} into Redis (the processor's FoldWriter), no Spark",
        module="bench.peers.baseline_peer",
        redis=True,
        prepare=_baseline,
        ends_itself=True,
    ),
    Engine(
        "quix",
        "Quix Streams, RocksDB",
        f"{_EOS} (Kafka transactions, changelog topics), commits every 5 s (its default)",
        module="bench.peers.quix_peer",
        changelog=True,
    ),
    Engine(
        "quix-redis",
        "Quix Streams + Redis sink",
        f"{_EOS} in Kafka; the Redis sink at least once (a pipeline per 5 s checkpoint)",
        module="bench.peers.quix_peer",
        redis=True,
    ),
    Engine(
        "bytewax",
        "Bytewax, in memory",
        "none: no recovery, a restart folds the topic again from its start",
        module="bench.peers.bytewax_peer",
        prepare=_bytewax,
        ends_itself=True,
    ),
    Engine(
        "bytewax-recovery",
        "Bytewax, recovery on",
        "state snapshots to SQLite every 10 s epoch (its default): resumes from the last one",
        module="bench.peers.bytewax_peer",
        prepare=_bytewax_recovery,
        ends_itself=True,
    ),
    Engine(
        "bytewax-redis",
        "Bytewax + Redis sink",
        "recovery on (10 s epochs); the Redis writes at least once (a pipeline per batch)",
        module="bench.peers.bytewax_peer",
        redis=True,
        prepare=_bytewax_recovery,
        ends_itself=True,
    ),
    Engine(
        "kafka-streams",
        "Kafka Streams, RocksDB",
        f"{_EOS} (exactly_once_v2: Kafka transactions, changelog topics); state local",
        java="KafkaStreamsPeer",
        jars="kafka-streams",
    ),
    Engine(
        "kafka-streams-redis",
        "Kafka Streams + Redis",
        f"{_EOS} in Kafka; the Redis writes at least once (a pipeline per 1,000 records)",
        java="KafkaStreamsPeer",
        jars="kafka-streams",
        redis=True,
    ),
    Engine(
        "flink",
        "Flink MiniCluster, heap state",
        f"{_EOS} state (checkpoints every second); outputs at least once without a 2PC sink",
        java="FlinkPeer",
        jars="flink",
        ends_itself=True,
    ),
    Engine(
        "flink-redis",
        "Flink + Redis",
        f"{_EOS} state; the Redis writes at least once (a pipeline per 1,000 and per checkpoint)",
        java="FlinkPeer",
        jars="flink",
        redis=True,
        ends_itself=True,
    ),
)
