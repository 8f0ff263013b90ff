"""Read a consumer group's committed offsets the way lag tools do (admin API)."""

from __future__ import annotations

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from refold.contracts.settings import KafkaSettings

__all__ = ["committed_offsets"]


def committed_offsets(kafka: KafkaSettings, group_id: str) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> committed offset`` of ``group_id``."""
    admin = AdminClient(kafka.as_librdkafka())
    group = ConsumerGroupTopicPartitions(group_id)
    found = admin.list_consumer_group_offsets([group])[group_id].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions}
