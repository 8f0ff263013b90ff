"""Mirror a generation's applied positions to a Kafka consumer group, for standard lag tools.

Spark keeps its own offsets in the checkpoint and Redis holds the applied positions (the truth);
the group ``refold.<processor>.g<N>`` only makes lag visible to ``kafka-consumer-groups`` and
friends. Commits use assign-less ``commit(offsets=...)`` without joining the group: a
member-less group is what Kafka expects for offsets committed on a group's behalf, and nothing
rebalances.

Driver side; not picklable; failures are logged, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from contracts.kafka.logs import routed
from contracts.layout import parse_position_field

__all__ = ["ConsumerGroupMirror"]

logger = logging.getLogger(__name__)


class ConsumerGroupMirror:
    """Commits ``topic/partition -> next offset`` maps to one consumer group.

    Args:
        kafka: librdkafka settings.
        group_id: The consumer group.
    """

    def __init__(self, kafka: Mapping[str, str], group_id: str) -> None:
        self.group_id = group_id
        self._config = {
            **kafka,
            "group.id": group_id,
            "enable.auto.commit": "false",
            "allow.auto.create.topics": "false",
        }
        self._consumer: Consumer | None = None

    def commit(self, positions: Mapping[str, int]) -> None:
        """Commit the positions (fields as in the Redis positions hash); never raises."""
        offsets = []
        for field, offset in positions.items():
            parsed = parse_position_field(field)
            if parsed is not None:
                offsets.append(TopicPartition(parsed[0], parsed[1], offset))
        if not offsets:
            return
        try:
            if self._consumer is None:
                self._consumer = Consumer(routed(self._config))
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:
            logger.warning(
                "could not commit offsets to group %s: %s",
                self.group_id,
                exc,
                extra={"consumer_group": self.group_id},
            )

    def close(self) -> None:
        """Close the consumer (it never joined, so no rebalance happens)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
