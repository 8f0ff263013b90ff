"""The stats hash's pure side: what one batch adds, and parsing it back."""

import math

from refold.contracts.layout import StateLayout
from refold.contracts.store.stats import (
    DURATION_BOUNDS_MS,
    BatchStats,
    batch_increments,
    parse_stats,
)


def _hash(*batches: tuple[int, int, int, dict[str, int], float]) -> dict[bytes, bytes]:
    """What HINCRBY of each batch's increments leaves in Redis, as HGETALL returns it."""
    stored: dict[str, int] = {}
    for batch in batches:
        for name, amount in batch_increments(*batch):
            stored[name] = stored.get(name, 0) + amount
    return {k.encode(): str(v).encode() for k, v in stored.items()}


def test_a_batch_adds_its_counts_and_the_buckets_at_or_above_its_duration():
    pairs = dict(batch_increments(10, 2, 3, {"rejected": 1, "bad-body": 0}, 249.6))
    assert pairs["batches"] == 1
    assert (pairs["events"], pairs["duplicates"], pairs["effects"]) == (10, 2, 3)
    assert pairs["dead:rejected"] == 1
    assert "dead:bad-body" not in pairs  # zeros are left out
    assert pairs["dur_sum_ms"] == 250
    assert [k for k in pairs if k.startswith("dur_le:")] == [
        f"dur_le:{b}" for b in DURATION_BOUNDS_MS if b >= 250
    ] + ["dur_le:+Inf"]


def test_parsed_stats_hold_the_sums_and_a_cumulative_histogram():
    raw = _hash(
        (10, 0, 1, {"rejected": 1}, 40),
        (5, 1, 0, {"rejected": 2, "late": 1}, 700),
        (0, 0, 0, {}, 45_000),
    )
    raw |= {b"last_batch_id": b"7", b"last_batch_at": b"1700000000000", b"watermark_ms": b"99"}
    stats = parse_stats(raw)
    assert (stats.batches, stats.events, stats.duplicates, stats.effects) == (3, 15, 1, 1)
    assert stats.dead_letters == {"late": 1, "rejected": 3}
    assert stats.dead_letters_total == 4
    assert stats.duration_sum_ms == 45_740
    assert stats.mean_duration_ms == 45_740 / 3
    buckets = dict(stats.duration_buckets)
    assert list(buckets) == sorted(buckets)
    assert (buckets[50.0], buckets[500.0], buckets[1000.0], buckets[30000.0]) == (1, 1, 2, 2)
    assert buckets[math.inf] == 3
    counts = [n for _bound, n in stats.duration_buckets]
    assert counts == sorted(counts)  # cumulative
    assert (stats.last_batch_id, stats.last_batch_at) == (7, 1_700_000_000_000)
    assert stats.watermark_ms == 99


def test_an_empty_hash_parses_as_zeros_with_every_bucket():
    stats = parse_stats({})
    assert stats == BatchStats(
        duration_buckets=(*((float(b), 0) for b in DURATION_BOUNDS_MS), (math.inf, 0))
    )
    assert stats.mean_duration_ms is None
    assert stats.last_batch_id is None


def test_unknown_fields_are_ignored_and_str_hashes_parse_too():
    stats = parse_stats({"batches": "2", "checkpoint_id": "abc", "something_new": "x"})
    assert stats.batches == 2
    assert stats.checkpoint_id == "abc"


def test_the_stats_key_is_in_the_generation_but_not_its_state():
    keys = StateLayout("order_state", "p").generation(4)
    assert keys.stats == "p:{order_state.g4}:stats"
    assert not keys.is_state_key(keys.stats)
    assert keys.stats.startswith(keys.pattern()[:-1])  # gc's pattern removes it
