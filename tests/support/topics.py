"""Read a whole topic as it is now, for tests: every partition up to its end, then return.

The one way tests read a topic's records: up to each partition's end (for ``read_committed``
the last stable offset: records of open transactions are not readable yet), told by librdkafka's
end-of-partition events. It returns as soon as every partition has reached its end, instead of
waiting for seconds of silence, so a probe polled by ``assert_eventually`` costs milliseconds.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, TopicPartition

from refold.contracts.kafka.consumers import Isolation, passive_consumer

__all__ = ["read_to_end"]


def read_to_end(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout: float = 30.0,
) -> list[Message]:
    """Every readable record of ``topic`` now, partition by partition in offset order.

    Raises:
        AssertionError: A partition did not reach its end within ``timeout`` seconds.
    """
    consumer = passive_consumer(
        {"bootstrap.servers": bootstrap}, "test-reader", isolation=isolation, eof=True
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[Message] = []
        ended: set[int] = set()
        while len(ended) < len(partitions):
            message = consumer.poll(timeout)
            assert message is not None, f"{topic} was not read to its end in {timeout:.0f} s"
            error = message.error()
            if error is None:
                found.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition())
        return sorted(found, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()
