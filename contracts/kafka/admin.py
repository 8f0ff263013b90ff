"""Create topics from their specs (explicitly: brokers may auto-create with other settings)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.credentials import AuthWatch, not_answering, refused
from refold.contracts.topics import TopicSpec

__all__ = ["KafkaUnreachableError", "delete_topics", "ensure_topics"]

_CLIENT = "the admin client (topics)"


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
) -> None:
    """Create every topic that does not exist yet; check the partition count of those that do.

    Args:
        kafka: librdkafka settings.
        specs: The topics.
        timeout: Seconds per admin call.
        check_partitions: False for topics a processor only writes to (its outputs): an
            existing one is used with whatever partition count it has (the producer hashes keys
            over it; a consumer checks its own inputs).

    Raises:
        RefoldError: A topic exists with another partition count (keys would map elsewhere),
            or the broker refused to create one.
        KafkaUnreachableError: No broker answered within ``timeout``.
    """
    watch = AuthWatch()
    config: dict[str, Any] = {**kafka, "error_cb": watch}
    admin = AdminClient(config)
    wanted = {spec.name: spec for spec in specs}
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        admin.poll(0)  # serves the error callbacks: a refused login is one
        if watch.failure is not None:
            raise refused(_CLIENT, kafka, watch.failure) from exc
        reason = not_answering(kafka, exc)
        if reason is not None:
            raise KafkaUnreachableError(reason) from exc
        raise
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
    missing = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            # -1: the broker's default.replication.factor (KIP-464), so one setting on the
            # cluster decides, and min.insync.replicas comes from the broker too.
            replication_factor=-1 if s.replication_factor is None else s.replication_factor,
            config=dict(s.config),
        )
        for name, s in wanted.items()
        if name not in existing
    ]
    if not missing:
        return
    _create(admin, missing, timeout)
    _wait_visible(admin, [t.topic for t in missing], timeout)


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
