"""Which partition a key is on: Kafka's default partitioner, as refold's producers use it.

refold's producers partition by key with librdkafka's ``murmur2_random``, which is the Java
client's ``DefaultPartitioner``: ``toPositive(murmur2(key)) % partitions``. A reader of a state
sharded by partition id (``GenerationKeys.shards``) computes an entity's shard with it.

Written here (about twenty lines) rather than taken from a library: confluent-kafka does not
expose its partitioner to Python, and kafka-python, which has one, is a whole second Kafka
client to install for one function. ``tests/integration/test_publisher.py`` checks it against
where a real broker put each key.
"""

from __future__ import annotations

__all__ = ["key_partition", "murmur2"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) of ``data``, as an unsigned 32-bit integer."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    rest = length % 4
    tail = data[length - rest :]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h = ((h ^ tail[0]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def key_partition(key: str | bytes, partitions: int) -> int:
    """The partition a record keyed ``key`` goes to, of ``partitions``."""
    data = key.encode() if isinstance(key, str) else key
    return (murmur2(data) & 0x7FFFFFFF) % partitions
