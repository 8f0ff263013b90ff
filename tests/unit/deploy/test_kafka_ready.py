"""The ids the readiness probe asks for map to every partition, as Kafka maps them."""

from __future__ import annotations

from refold.deploy.kafka_ready import _partition_of, ids_for_every_partition


def test_ids_map_to_partitions_by_javas_string_hash():
    assert _partition_of("hello", 2**31) == 99162322  # "hello".hashCode() in Java
    assert _partition_of("polygenelubricants", 2**31) == 0  # hashCode() is Integer.MIN_VALUE
    assert _partition_of("é", 2**31) == 233  # one UTF-16 code unit


def test_one_id_per_partition():
    ids = ids_for_every_partition("refold-ready-probe", 8)
    assert [_partition_of(i, 8) for i in ids] == list(range(8))
