"""Mirror a generation's applied positions to a Kafka consumer group, for standard lag tools.

Spark keeps its own offsets in the checkpoint and Redis holds the applied positions (the truth);
the group ``refold.<processor>.g<N>`` only makes lag visible to ``kafka-consumer-groups`` and
friends. Commits use assign-less ``commit(offsets=...)`` without joining the group: a
member-less group is what Kafka expects for offsets committed on a group's behalf, and nothing
rebalances. Commits are asynchronous: a broker that is away never holds the batch up (a
synchronous commit blocked the driver for the whole outage), and a failed commit is logged when
the next commit serves its callback.

Driver side; not picklable; failures are logged, never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from refold.contracts.kafka.consumers import passive_consumer_config
from refold.contracts.kafka.logs import routed
from refold.contracts.layout import parse_position_field

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
        # The passive configuration keeps librdkafka from committing on its own; commit()
        # below is the only writer of the group's offsets, explicitly.
        self._config = {
            **passive_consumer_config(kafka, group_id),
            "on_commit": self._committed,
        }
        self._consumer: Consumer | None = None
        self._pending = 0  # asynchronous commits not answered yet

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
            self._consumer.poll(0)  # serves the callbacks of earlier commits
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:
            self._warn(exc)
            return
        self._pending += 1

    def _committed(self, error: object, _offsets: object) -> None:
        self._pending -= 1
        if error is not None:
            self._warn(error)

    def _warn(self, error: object) -> None:
        logger.warning(
            "could not commit offsets to group %s: %s",
            self.group_id,
            error,
            extra={"consumer_group": self.group_id},
        )

    def close(self, timeout: float = 10.0) -> None:
        """Close the consumer (it never joined, so no rebalance happens).

        The last commits are waited for, up to ``timeout`` seconds (the broker may be away).
        """
        if self._consumer is not None:
            deadline = time.monotonic() + timeout
            while self._pending > 0 and time.monotonic() < deadline:
                self._consumer.poll(0.1)
            self._consumer.close()
            self._consumer = None
