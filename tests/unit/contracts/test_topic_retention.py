"""Retention as code: a TopicSpec's retention_ms / retention_bytes, validated, and what changes."""

from __future__ import annotations

import pytest

from refold.contracts.kafka.admin import ConfigChange, config_changes
from refold.contracts.topics import TopicSpec
from refold.deploy.cli import _retention


def spec(**retention: object) -> TopicSpec:
    return TopicSpec("shop.orders", 4, "order_id", ("OrderPlaced",), **retention)  # type: ignore[arg-type]


def test_retention_becomes_the_topic_configs_it_is_created_with():
    orders = spec(
        retention_ms=86_400_000, retention_bytes=-1, config=(("cleanup.policy", "delete"),)
    )
    assert orders.retention == {"retention.ms": "86400000", "retention.bytes": "-1"}
    assert orders.topic_config == {
        "cleanup.policy": "delete",
        "retention.ms": "86400000",
        "retention.bytes": "-1",
    }
    assert spec(retention_ms=-1).retention == {"retention.ms": "-1"}
    assert spec().retention == {}  # the broker's defaults
    assert spec().topic_config == {}


@pytest.mark.parametrize("field", ["retention_ms", "retention_bytes"])
@pytest.mark.parametrize("value", [0, -2, -86_400_000, 1.5, "7d", True])
def test_a_retention_that_is_not_positive_or_minus_one_names_the_topic_and_field(field, value):
    with pytest.raises(ValueError, match=rf"topic shop\.orders: {field} must be a positive"):
        spec(**{field: value})


def test_retention_in_config_is_refused_for_the_field_that_refold_topics_applies():
    with pytest.raises(ValueError, match=r"shop\.orders: retention\.ms in config; .*retention_ms="):
        spec(config=(("retention.ms", "1000"),))
    with pytest.raises(ValueError, match=r"retention\.bytes in config; .*retention_bytes="):
        spec(retention_ms=1000, config=(("retention.bytes", "1000"),))


def test_only_the_retention_the_spec_sets_and_that_differs_is_changed():
    described = {"retention.ms": "604800000", "retention.bytes": "-1", "cleanup.policy": "delete"}
    assert config_changes(spec(retention_ms=86_400_000, retention_bytes=-1), described) == [
        ConfigChange("shop.orders", "retention.ms", "604800000", "86400000")
    ]
    assert str(config_changes(spec(retention_ms=86_400_000), described)[0]) == (
        "retention.ms 604800000 -> 86400000"
    )
    assert config_changes(spec(retention_ms=604_800_000), described) == []
    assert config_changes(spec(), described) == []  # nothing set: never touched


def test_the_retention_a_topic_gets_reads_as_a_person_would_say_it():
    assert _retention(spec()) == "broker default"
    assert _retention(spec(retention_ms=86_400_000)) == "1d"
    assert _retention(spec(retention_ms=-1)) == "unlimited time"
    assert _retention(spec(retention_ms=3_600_000, retention_bytes=1 << 30)) == (
        "1h or 1GiB per partition"
    )
    assert _retention(spec(retention_bytes=1500)) == "1500B per partition"
