"""Create topics from their specs (explicitly: brokers may auto-create with other settings)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from contracts.errors import RefoldError
from contracts.topics import TopicSpec

__all__ = ["delete_topics", "ensure_topics"]


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
    """
    admin = AdminClient(dict(kafka))
    wanted = {spec.name: spec for spec in specs}
    existing = admin.list_topics(timeout=timeout).topics
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
            replication_factor=s.replication_factor,
            config=dict(s.config),
        )
        for name, s in wanted.items()
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                msg = f"could not create topic {name}: {exc}"
                raise RefoldError(msg) from exc


def delete_topics(kafka: Mapping[str, str], names: Iterable[str], timeout: float = 30) -> None:
    """Delete topics; missing ones are ignored."""
    admin = AdminClient(dict(kafka))
    existing = admin.list_topics(timeout=timeout).topics
    names = [n for n in names if n in existing]
    if not names:
        return
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        future.result(timeout=timeout)
