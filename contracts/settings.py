"""Settings blocks shared by every deployable (each composes them in its own ``config.py``).

Environment names: ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``, ``REFOLD_SPARK__*``,
``REFOLD_SCHEMA_REGISTRY__*`` (nested with ``__``); each processor's own options are
``REFOLD_<PROCESSOR>__*`` (see :class:`refold.contracts.processors.ProcessorOptions`).
Secrets are ``SecretStr``: they print as ``**********`` and reach clients only through
:meth:`KafkaSettings.as_librdkafka` (and its Java form, :meth:`KafkaSettings.as_java_client`),
:meth:`RedisSettings.client_kwargs` and :meth:`SchemaRegistrySettings.client_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.schema_registry import SchemaRegistrySettings
from refold.contracts.store.connect import redis_client

__all__ = [
    "KafkaSettings",
    "RedisSettings",
    "SchemaRegistrySettings",
    "SparkSettings",
    "StackSettings",
]


class KafkaSettings(BaseModel):
    """Where the Kafka cluster is, and extra librdkafka properties.

    Attributes:
        bootstrap_servers: Comma-separated ``host:port`` list.
        client_properties: Extra librdkafka properties (security protocol, timeouts, ...),
            applied last.
        secret_properties: librdkafka properties that are secrets (``sasl.password``,
            ``ssl.key.password``): never logged, applied after ``client_properties``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:19092"
    client_properties: dict[str, str] = Field(default_factory=dict)
    secret_properties: dict[str, SecretStr] = Field(default_factory=dict)

    def as_librdkafka(self) -> dict[str, str]:
        """The one translation point to librdkafka configuration."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            **self.client_properties,
            **{k: v.get_secret_value() for k, v in self.secret_properties.items()},
        }

    def as_java_client(self) -> dict[str, str]:
        """The same configuration for a Java client (Spark's ``kafka`` source).

        Raises:
            JavaClientConfigError: A setting with no Java equivalent refold can build.
        """
        from refold.contracts.kafka.java_client import java_client_properties

        return java_client_properties(self.as_librdkafka())


class RedisSettings(BaseModel):
    """Where Redis is, and the key prefix of refold's keys.

    Attributes:
        url: redis-py URL (``redis://`` or ``rediss://`` for TLS; ``redis+cluster://`` for a Redis
            Cluster, see :mod:`refold.contracts.store.connect`); keep passwords out of it
            and in ``password``.
        key_prefix: Prefix of every key refold writes (tests use a unique one each).
        username: ACL user, if any.
        password: AUTH password, if any.
        shard_state: Whether a processor's new generations are sharded by partition id
            (docs/state-layout.md, "On a Redis Cluster"): ``auto`` (the default) on a Redis
            Cluster (entity folds), ``on`` window processors too and on a single Redis too,
            ``off`` never. Only co-partitioned folds are sharded; a generation keeps what it
            was created with.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = "redis://127.0.0.1:16379/0"
    key_prefix: str = DEFAULT_KEY_PREFIX
    username: str | None = None
    password: SecretStr | None = None
    shard_state: Literal["auto", "on", "off"] = "auto"

    def client(self, **options: Any) -> redis.Redis:
        """A redis-py client of this Redis, single server or cluster by the URL's scheme.

        ``options`` go to redis-py (e.g. ``socket_timeout``). See
        :func:`refold.contracts.store.connect.redis_client`.
        """
        return redis_client(self.client_url(), **options)

    def client_url(self) -> str:
        """The URL with the credentials in it (for clients that take only a URL)."""
        if self.password is None:
            return self.url
        scheme, sep, rest = self.url.partition("://")
        if not sep or "@" in rest:
            return self.url
        user = self.username or ""
        return f"{scheme}://{user}:{self.password.get_secret_value()}@{rest}"


class SparkSettings(BaseModel):
    """Where processors run Spark, and how much of the cluster one application may take.

    Attributes:
        master: Spark master URL: ``local[2]`` (in-process), ``spark://host:7077`` (standalone,
            e.g. ``refold cluster up``), ``yarn``, ``k8s://...``.
        cores_max: ``spark.cores.max``: cores one application takes on a cluster, so that several
            applications share it (None: Spark's default, which is every core).
        executor_memory: ``spark.executor.memory`` on a cluster.
        driver_memory: ``spark.driver.memory``.
        checkpoint_url: Where Spark checkpoints live (a URL or path; shared storage such as
            ``hdfs://`` or ``s3a://`` in production). Default: ``<state_dir>/checkpoints``.
        jars_dir: A folder whose jars go on ``spark.jars``: Spark's Kafka connector, for a
            processor whose ``source_format`` is ``kafka``. Default: ``.jars/spark`` of the
            checkout (``make setup`` fills it with mvn).
        class_archive: The driver JVM's class archive (JDK class data sharing: Spark starts on
            about half the CPU). Default: ``.jars/jvm/spark-<pyspark version>.jsa`` of the
            checkout, which ``make setup`` builds; none there, none used.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = "local[2]"
    cores_max: int | None = None
    executor_memory: str = "1g"
    driver_memory: str = "2g"
    checkpoint_url: str | None = None
    jars_dir: Path | None = None
    class_archive: Path | None = None


class StackSettings(BaseSettings):
    """Where the stack is: the settings every deployable shares.

    Read from ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``, ``REFOLD_SPARK__*`` and
    ``REFOLD_STATE_DIR``. Built once, in a ``__main__`` (or in a user's script:
    ``StackSettings()`` reads the variables the processors read), then passed on explicitly.
    Deployables with settings of their own subclass it.
    """

    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    # REFOLD_SCHEMA_REGISTRY__*: the registry of registry-framed topics (docs/schema-registry.md)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    state_dir: Path = Path(".state")
    # REFOLD_ARCHIVE_ROOT: where the archive is (default <state dir>/archive). The archive
    # processor writes there, and reads below a partition's log start take records from it.
    archive_root: Path | None = None

    @property
    def archive_dir(self) -> Path:
        """The archive's directory: ``archive_root``, else ``<state dir>/archive``."""
        return self.archive_root or self.state_dir / "archive"

    def cold_tier(self) -> Path | None:
        """The archive that serves reads below the log start, if one is there (DESIGN 20)."""
        from refold.contracts.archive_coverage import ArchiveLedger

        return self.archive_dir if ArchiveLedger(self.archive_dir).is_archive() else None
