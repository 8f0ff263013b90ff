"""Re-keying: the co-partitioning check and link resolution, independent of batch boundaries."""

from __future__ import annotations

import random

import pytest

from refold.processors.fold.rekey import KeyingError, KeyResolver, Link, plan_keying, slot_of


def test_topics_keyed_by_the_key_with_equal_partition_counts_are_co_partitioned():
    keying = plan_keying("session_id", [("a", "session_id", 8), ("b", "session_id", 8)], [], 2)
    assert keying.slots == 0
    assert "co-partitioned" in keying.reason


def test_other_partition_keys_or_counts_re_key():
    keying = plan_keying(
        "customer_id",
        [("orders", "order_id", 8), ("crm", "customer_id", 4)],
        [("order_id", "customer_id")],
        3,
    )
    assert (keying.slots, keying.via) == (3, ("order_id",))
    same_key = plan_keying("k", [("a", "k", 8), ("b", "k", 4)], [], 2)
    assert same_key.slots == 2
    assert "partition counts differ" in same_key.reason


def test_a_link_through_a_field_no_topic_is_partitioned_by_is_refused():
    with pytest.raises(KeyingError, match="partition key of a topic"):
        plan_keying("customer_id", [("orders", "order_id", 8)], [("cart_id", "customer_id")], 2)


def test_slots_are_stable_and_spread():
    assert slot_of("cus-000001", 4) == slot_of("cus-000001", 4)  # CRC-32: no hash seed
    spread = {slot_of(f"cus-{i:06d}", 4) for i in range(100)}
    assert spread == {0, 1, 2, 3}


def _log(orders: int, seed: int) -> list[tuple[int, int, dict]]:
    """(partition, offset, event) of placed/paid orders on 4 partitions, in log order."""
    rng = random.Random(seed)
    logs: dict[int, list[dict]] = {p: [] for p in range(4)}
    for i in range(orders):
        partition = i % 4
        logs[partition].append({"order_id": f"o{i}", "customer_id": f"c{rng.randrange(9)}"})
        logs[partition].append({"order_id": f"o{i}"})  # paid: no customer
    logs[0].insert(0, {"order_id": "orphan"})  # no earlier event links it
    return [(p, offset, e) for p, events in logs.items() for offset, e in enumerate(events)]


def _resolve_in_batches(log, batch: int) -> dict[tuple[int, int], str | None]:
    """Resolve like live slots: per batch, a fresh resolver with what earlier batches stored."""
    stored: dict[tuple[str, str], Link] = {}
    out: dict[tuple[int, int], str | None] = {}
    by_partition: dict[int, list] = {}
    for p, offset, event in log:
        by_partition.setdefault(p, []).append((offset, event))
    ends = {p: 0 for p in by_partition}
    while any(ends[p] < len(v) for p, v in by_partition.items()):
        resolver = KeyResolver("customer_id", ("order_id",))
        for p in sorted(by_partition, reverse=batch % 2 == 0):  # partitions in varying order
            chunk = by_partition[p][ends[p] : ends[p] + batch]
            ends[p] += len(chunk)
            made_here = []
            for offset, event in chunk:
                entity, made = resolver.resolve(offset, event, {k: v for k, v in stored.items()})
                out[(p, offset)] = entity
                made_here.extend(made)
            for via, value, link in made_here:
                stored.setdefault((via, value), link)
    return out


def test_resolution_does_not_depend_on_batch_boundaries():
    log = _log(200, seed=5)
    reference = _resolve_in_batches(log, batch=10**6)
    assert reference[(0, 0)] is None  # the orphan
    assert sum(v is not None for v in reference.values()) == 400
    for batch in (1, 7, 50):
        assert _resolve_in_batches(log, batch) == reference


def test_a_stored_link_made_after_the_record_is_not_used():
    resolver = KeyResolver("customer_id", ("order_id",))
    later = {("order_id", "o1"): Link(offset=9, key="c1")}
    assert resolver.resolve(5, {"order_id": "o1"}, later) == (None, [])
    assert resolver.resolve(10, {"order_id": "o1"}, later)[0] == "c1"


def test_the_first_link_wins():
    resolver = KeyResolver("customer_id", ("order_id",))
    _entity, made = resolver.resolve(1, {"order_id": "o", "customer_id": "a"})
    assert made == [("order_id", "o", Link(1, "a"))]
    assert resolver.resolve(2, {"order_id": "o", "customer_id": "b"}) == ("b", [])
    assert resolver.resolve(3, {"order_id": "o"})[0] == "a"
