"""What a dead-letter topic holds, for the dead-letters-once tests of every engine."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from refold.contracts.origin import (
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
)

__all__ = ["dlq_letters"]


def dlq_letters(bootstrap: str, topic: str) -> list[tuple[int, int, str, int]]:
    """(origin partition, origin offset, reason, generation) of every letter on the topic."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": "false"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found, idle = [], 0
    while idle < 6:
        batch = [m for m in consumer.consume(500, timeout=0.5) if m.error() is None]
        idle = 0 if batch else idle + 1
        for message in batch:
            headers = {k: v.decode() for k, v in message.headers() or []}
            found.append(
                (
                    int(headers[ORIGIN_PARTITION]),
                    int(headers[ORIGIN_OFFSET]),
                    headers[DEAD_LETTER_REASON],
                    int(headers[ORIGIN_GENERATION]),
                )
            )
    consumer.close()
    return found
