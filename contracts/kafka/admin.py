"""Create topics from their specs (explicitly: brokers may auto-create with other settings)."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.credentials import AuthWatch, not_answering, refused
from refold.contracts.topics import TopicSpec

__all__ = [
    "ConfigChange",
    "KafkaUnreachableError",
    "TopicsReport",
    "config_changes",
    "delete_topics",
    "ensure_topics",
    "single_replica_topics",
    "tiering",
]

logger = logging.getLogger(__name__)

_CLIENT = "the admin client (topics)"
# A broker with a remote tier (KIP-405) says so in this config of its own.
_REMOTE_STORAGE_SYSTEM = "remote.log.storage.system.enable"
_TIERED = "remote.storage.enable"


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One topic config an existing topic gets from its spec: ``retention.ms 604800000 -> 1``.

    Attributes:
        topic: The topic.
        key: The config (``retention.ms``, ``retention.bytes``).
        old: Its value on the broker before (the broker's default when it had none of its own).
        new: The spec's value.
    """

    topic: str
    key: str
    old: str | None
    new: str

    def __str__(self) -> str:
        return f"{self.key} {self.old} -> {self.new}"


@dataclass(frozen=True, slots=True)
class TopicsReport:
    """What :func:`ensure_topics` did (or, in a dry run, would do).

    Attributes:
        created: Topics created.
        altered: Configs changed on existing topics, in spec order.
    """

    created: tuple[str, ...] = ()
    altered: tuple[ConfigChange, ...] = ()

    def changes(self, topic: str) -> list[ConfigChange]:
        """The changes of one topic."""
        return [c for c in self.altered if c.topic == topic]


def tiering(spec: TopicSpec) -> dict[str, str]:
    """The config that tiers ``spec``'s topic on a broker with a remote tier (pure).

    ``remote.storage.enable=true``, unless the topic is compacted (Kafka cannot tier it) or the
    spec's ``config`` sets ``remote.storage.enable`` itself (``false`` keeps it local). How long
    a segment stays on the broker's disk is the broker's ``log.local.retention.ms``, or the
    spec's ``local.retention.ms`` in ``config``.
    """
    config = dict(spec.config)
    if _TIERED in config or "compact" in config.get("cleanup.policy", ""):
        return {}
    return {_TIERED: "true"}


def config_changes(
    spec: TopicSpec, current: Mapping[str, str | None], *, tiered: bool = False
) -> list[ConfigChange]:
    """The retention configs of ``spec`` whose value on the topic differs (pure).

    Args:
        spec: The topic's spec; a retention it does not set is left alone.
        current: The topic's configs as the broker describes them (defaults included).
        tiered: The broker has a remote tier: the topic is tiered too (:func:`tiering`).
    """
    wanted = {**spec.retention, **(tiering(spec) if tiered else {})}
    return [
        ConfigChange(spec.name, key, current.get(key), value)
        for key, value in wanted.items()
        if current.get(key) != value
    ]


class KafkaUnreachableError(RefoldError):
    """No broker of ``bootstrap.servers`` answered: down, or another address."""

    code = "KAFKA_UNREACHABLE"
    retriable = True


def ensure_topics(
    kafka: Mapping[str, str],
    specs: Iterable[TopicSpec],
    timeout: float = 30,
    *,
    check_partitions: bool = True,
    alter_retention: bool = False,
    dry_run: bool = False,
) -> TopicsReport:
    """Create every topic that does not exist yet; check the partition count of those that do.

    A topic is created with its spec's configs and retention (:attr:`TopicSpec.topic_config`);
    on a broker with a remote tier (KIP-405, ``remote.log.storage.system.enable``) it is tiered
    too (:func:`tiering`): tiering is the cluster's choice, so one contract set runs on brokers
    with and without one.

    Args:
        kafka: librdkafka settings.
        specs: The topics.
        timeout: Seconds per admin call.
        check_partitions: False for topics a processor only writes to (its outputs): an
            existing one is used with whatever partition count it has (the producer hashes keys
            over it; a consumer checks its own inputs).
        alter_retention: Also set the spec's retention on existing topics whose value
            differs, and tier them on a broker with a remote tier (``refold topics``). A
            processor's start does not: a rollback to older code would set the older retention
            back.
        dry_run: Create and alter nothing; the report says what would be.

    Returns:
        The topics created and the configs altered (or that would be).

    Raises:
        RefoldError: A topic exists with another partition count (keys would map elsewhere),
            or the broker refused to create one or to alter its configs.
        KafkaUnreachableError: No broker answered within ``timeout``.
    """
    watch = AuthWatch()
    config: dict[str, Any] = {**kafka, "error_cb": watch}
    admin = AdminClient(config)
    wanted = {spec.name: spec for spec in specs}
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        admin.poll(0)  # serves the error callbacks: a refused login is one
        if watch.failure is not None:
            raise refused(_CLIENT, kafka, watch.failure) from exc
        reason = not_answering(kafka, exc)
        if reason is not None:
            raise KafkaUnreachableError(reason) from exc
        raise
    existing = metadata.topics
    for name, spec in wanted.items():
        if (
            check_partitions
            and name in existing
            and len(existing[name].partitions) != spec.partitions
        ):
            msg = (
                f"topic {name} has {len(existing[name].partitions)} partitions, the spec says "
                f"{spec.partitions}. Operator action: fix the spec or recreate the topic."
            )
            raise RefoldError(msg)
    for name in single_replica_topics(wanted.values(), existing, len(metadata.brokers)):
        logger.warning(
            "topic %s has replication factor 1 on a cluster of %d brokers: the loss of the "
            "broker that holds a partition loses its records and stops its writes. Operator "
            "action: leave replication_factor unset in its TopicSpec (the cluster's "
            "default.replication.factor, 3 on `refold up --kafka-nodes 3`), or reassign it to "
            "3 replicas (kafka-reassign-partitions)",
            name,
            len(metadata.brokers),
        )
    new = [s for name, s in wanted.items() if name not in existing]
    tiered = bool(new or alter_retention) and _broker_tiers(admin, metadata.brokers, timeout)
    missing = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            # -1: the broker's default.replication.factor (KIP-464), so one setting on the
            # cluster decides, and min.insync.replicas comes from the broker too.
            replication_factor=-1 if s.replication_factor is None else s.replication_factor,
            config={**s.topic_config, **(tiering(s) if tiered else {})},
        )
        for s in new
    ]
    altered: list[ConfigChange] = []
    if alter_retention:
        kept = [
            s
            for name, s in wanted.items()
            if name in existing and (s.retention or (tiered and tiering(s)))
        ]
        altered = _retention_changes(admin, kept, timeout, tiered=tiered)
    report = TopicsReport(tuple(t.topic for t in missing), tuple(altered))
    if dry_run:
        return report
    if missing:
        _create(admin, missing, timeout)
        _wait_visible(admin, [t.topic for t in missing], timeout)
    if altered:
        _alter(admin, altered, timeout)
    return report


def single_replica_topics(
    specs: Iterable[TopicSpec], existing: Mapping[str, Any], brokers: int
) -> list[str]:
    """The topics of ``specs`` with one replica (or to be created so) on a cluster (pure).

    A cluster: more than one broker.

    Args:
        specs: The topics wanted.
        existing: The cluster's topics (``list_topics().topics``: partitions with replicas).
        brokers: How many brokers the cluster has; on one, every topic has one replica.
    """
    if brokers <= 1:
        return []
    found = []
    for spec in specs:
        topic = existing.get(spec.name)
        if topic is None:
            single = spec.replication_factor == 1
        else:
            single = any(len(p.replicas) == 1 for p in topic.partitions.values())
        if single:
            found.append(spec.name)
    return found


def _broker_tiers(admin: AdminClient, brokers: Mapping[int, Any], timeout: float) -> bool:
    """Whether the cluster's brokers have a remote tier (KIP-405), asked of one of them.

    A broker that does not let this client describe its configs counts as one without.
    """
    if not brokers:
        return False
    resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout
        )
    except (KafkaException, concurrent.futures.TimeoutError):
        return False
    entry = entries.get(_REMOTE_STORAGE_SYSTEM)
    return entry is not None and entry.value == "true"


def _retention_changes(
    admin: AdminClient, specs: list[TopicSpec], timeout: float, *, tiered: bool
) -> list[ConfigChange]:
    """The retention (and tiering) configs of existing topics that differ from their specs."""
    if not specs:
        return []
    resources = [ConfigResource(ResourceType.TOPIC, s.name) for s in specs]
    described = admin.describe_configs(resources, request_timeout=timeout)
    changes: list[ConfigChange] = []
    for spec, resource in zip(specs, resources, strict=True):
        try:
            entries = described[resource].result(timeout=timeout)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            msg = f"could not read the configs of topic {spec.name}: {exc}"
            raise RefoldError(msg) from exc
        changes += config_changes(spec, {k: e.value for k, e in entries.items()}, tiered=tiered)
    return changes


def _alter(admin: AdminClient, changes: list[ConfigChange], timeout: float) -> None:
    """Set ``changes`` (incremental: the topics' other configs stay as they are)."""
    by_topic: dict[str, list[ConfigEntry]] = {}
    for change in changes:
        by_topic.setdefault(change.topic, []).append(
            ConfigEntry(change.key, change.new, incremental_operation=AlterConfigOpType.SET)
        )
    resources = [
        ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        for topic, entries in by_topic.items()
    ]
    futures = admin.incremental_alter_configs(resources, request_timeout=timeout)
    for resource in resources:
        try:
            futures[resource].result(timeout=timeout)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            msg = f"could not alter the configs of topic {resource.name}: {exc}"
            raise RefoldError(msg) from exc


def _create(admin: AdminClient, topics: list[NewTopic], timeout: float) -> None:
    """Create ``topics``; those refused because every broker is fenced are asked again.

    A broker that missed its heartbeats for ``broker.session.timeout.ms`` (9 s: a stall of a
    loaded machine, a pause, a restart) is fenced by its controller until its next heartbeat,
    and meanwhile CreateTopics fails with INVALID_REPLICATION_FACTOR ("All brokers are
    currently fenced"). That passes by itself within a second, unlike a replication factor
    larger than the cluster, which fails at once.
    """
    deadline = time.monotonic() + timeout
    pending = {t.topic: t for t in topics}
    while pending:
        created = admin.create_topics(list(pending.values()), operation_timeout=timeout)
        for name, future in created.items():
            try:
                future.result(timeout=timeout)
            except concurrent.futures.TimeoutError as exc:
                msg = f"could not create topic {name}: the broker did not answer in {timeout}s"
                raise RefoldError(msg) from exc
            except KafkaException as exc:
                error = exc.args[0]
                if error.name() == "TOPIC_ALREADY_EXISTS":
                    pass
                elif _all_brokers_fenced(error) and time.monotonic() < deadline:
                    continue
                else:
                    msg = f"could not create topic {name}: {exc}"
                    raise RefoldError(msg) from exc
            del pending[name]
        if pending:
            time.sleep(0.2)


def _all_brokers_fenced(error: KafkaError) -> bool:
    # Kafka has no error code of its own for it: the message is what tells it apart.
    return error.code() == KafkaError.INVALID_REPLICATION_FACTOR and "fenced" in error.str()


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until the broker serves metadata of every new topic with its partitions' leaders.

    Kafka (KRaft) answers CreateTopics once its controller committed the topic; the broker
    learns it from the metadata log a moment later, and a client that asks in between gets
    UNKNOWN_TOPIC_OR_PART. Callers use a topic right after creating it.
    """
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        waiting = [
            n
            for n in names
            if n not in topics
            or topics[n].error is not None
            or not topics[n].partitions
            or any(p.leader < 0 for p in topics[n].partitions.values())
        ]
        if not waiting:
            return
        if time.monotonic() > deadline:
            msg = f"topics {', '.join(waiting)} were created but are not served after {timeout}s"
            raise RefoldError(msg)
        time.sleep(0.05)


def delete_topics(kafka: Mapping[str, str], names: Iterable[str], timeout: float = 30) -> None:
    """Delete topics; missing ones are ignored."""
    admin = AdminClient(dict(kafka))
    existing = admin.list_topics(timeout=timeout).topics
    names = [n for n in names if n in existing]
    if not names:
        return
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        future.result(timeout=timeout)
