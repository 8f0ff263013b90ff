"""Test helpers for window processors: the log as the oracle reads it, and Redis dumps."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from refold.contracts.codec import EventCodec
from refold.contracts.layout import GenerationKeys, parse_position_field, position_field
from refold.processors.runtime.kafka_ranges import read_log

__all__ = ["bucket_dump", "log_events", "sketch_counts"]


def log_events(bootstrap: str, topic: str) -> Iterator[tuple[str, int, str, dict]]:
    """Every record of ``topic`` as ``(partition field, offset, event_type, event)``, in log order
    per partition: the oracle's input is exactly what the processor read."""
    codec = EventCodec()
    for chunk in read_log({"bootstrap.servers": bootstrap}, topic, slot="test-oracle"):
        for message in chunk:
            decoded = codec.decode(message.value())
            field = position_field(message.topic() or "", message.partition() or 0)
            yield field, message.offset() or 0, decoded.event_type, decoded.data


def timed_input(bootstrap: str, *topics: str) -> Iterator[tuple[str, int, int, str, dict]]:
    """The topics' records as ``fold_timed`` takes them (each partition in log order, topic by
    topic): ``(topic, partition, offset, event type, event)``."""
    for topic in topics:
        for field, offset, event_type, event in log_events(bootstrap, topic):
            name, partition = parse_position_field(field)
            yield name, partition, offset, event_type, event


def bucket_dump(client: redis.Redis, keys: GenerationKeys) -> dict[tuple[str, int, str], dict]:
    """Every window bucket of a generation: ``(window, start, group)`` -> aggregates."""
    out = {}
    for name in client.scan_iter(match=keys.namespace_pattern("w:"), count=1000):
        bucket = keys.parse_window_bucket(name.decode())
        assert bucket is not None, name
        out[bucket] = {k.decode(): int(v) for k, v in client.hgetall(name).items()}
    return out


def sketch_counts(
    client: redis.Redis, keys: GenerationKeys
) -> dict[tuple[str, str, int, str], int]:
    """Every distinct-count sketch: ``(window, measure, start, group)`` -> PFCOUNT."""
    out = {}
    for name in client.scan_iter(match=keys.namespace_pattern("wd:"), count=1000):
        sketch = keys.parse_window_distinct(name.decode())
        assert sketch is not None, name
        out[sketch] = int(client.pfcount(name))
    return out
