"""Versioned tables (pure): the retention rule the table's fold, its replays and the oracle share,
and reads as of a time that say when retention dropped the version they need."""

from __future__ import annotations

import random

import pytest

from refold.processors.customer_profiles.projection import CustomerProfilesProjection
from refold.processors.fold.lookups import (
    EXPIRED,
    VersionRetention,
    add_version,
    as_of,
    version_at,
)
from refold.processors.fold.oracle import fold_all

MINUTE = 60_000


def _row(times, retention):
    row = None
    for i, at in enumerate(times):
        row = add_version(row, at, f"v{i}", retention)
    return row


def test_max_versions_keeps_the_newest_and_counts_the_dropped() -> None:
    row = _row([0, 10, 20, 30, 40], VersionRetention(max_versions=2))
    assert row["versions"] == [[30, "v3"], [40, "v4"]]
    assert row["dropped"] == 3
    assert as_of(row, 35) == "v3"
    assert as_of(row, 45) == "v4"
    assert as_of(row, 29) is EXPIRED  # v2 was valid then, and is gone
    assert as_of(None, 29) is None


def test_the_horizon_keeps_the_version_valid_at_its_start() -> None:
    retention = VersionRetention(max_versions=100, horizon_ms=25 * MINUTE)
    row = _row([0, 10 * MINUTE, 20 * MINUTE, 40 * MINUTE], retention)
    # newest 40 min: the horizon starts at 15 min, when v1 (from 10 min) was valid: kept.
    assert [v for _, v in row["versions"]] == ["v1", "v2", "v3"]
    assert row["dropped"] == 1
    assert as_of(row, 15 * MINUTE) == "v1"
    assert as_of(row, 9 * MINUTE) is EXPIRED


def test_a_row_that_never_dropped_a_version_answers_none_before_its_first() -> None:
    row = _row([100, 200], VersionRetention())
    assert "dropped" not in row
    assert as_of(row, 99) is None  # before the entity existed, not expired
    assert as_of(row, 150) == "v0"


def test_versions_come_in_valid_from_order_and_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="older than the newest"):
        add_version(_row([100], VersionRetention()), 99, "x", VersionRetention())
    with pytest.raises(ValueError, match="max_versions"):
        VersionRetention(max_versions=0)
    with pytest.raises(ValueError, match="horizon_ms"):
        VersionRetention(horizon_ms=-1)


def test_every_read_in_the_kept_range_equals_the_unbounded_table() -> None:
    rng = random.Random(5)
    times = sorted(rng.randrange(0, 500 * MINUTE) for _ in range(60))
    full = _row(times, VersionRetention(max_versions=1_000))
    for retention in (
        VersionRetention(max_versions=7),
        VersionRetention(max_versions=50, horizon_ms=60 * MINUTE),
        VersionRetention(max_versions=1),
    ):
        bounded = _row(times, retention)
        assert len(bounded["versions"]) <= retention.max_versions
        assert bounded["dropped"] + len(bounded["versions"]) == len(times)
        oldest = bounded["versions"][0][0]
        for at in range(0, 510 * MINUTE, 7 * MINUTE):
            expected = version_at(full["versions"], at)
            assert as_of(bounded, at) == (expected if at >= oldest else EXPIRED)


def test_customer_profiles_applies_its_retention_in_the_fold() -> None:
    registered = {
        "customer_id": "c1",
        "email": "a@x",
        "name": "A",
        "country": "NL",
        "tier": "bronze",
        "registered_at": 0,
    }
    changes = [
        ("ProfileChanged", {"customer_id": "c1", "tier": t, "changed_at": (i + 1) * MINUTE})
        for i, t in enumerate(["silver", "gold", "platinum", "gold"])
    ]
    fold = CustomerProfilesProjection(VersionRetention(max_versions=3))
    result = fold_all(fold, [("CustomerRegistered", registered), *changes])
    state = result.states["c1"]
    assert [v["tier"] for _, v in state["versions"]] == ["gold", "platinum", "gold"]
    assert result.aggregate["dropped_versions"] == 2
    assert result.aggregate["versions"] == 3
    assert as_of(state, 2 * MINUTE + 1) == state["versions"][0][1]
    assert as_of(state, MINUTE) is EXPIRED
