"""Which topics refold tiers on a broker with a remote tier (KIP-405), and what it alters."""

from refold.contracts.kafka.admin import ConfigChange, config_changes, tiering
from refold.contracts.topics import TopicSpec


def spec(**kw):
    return TopicSpec("shop.orders", 8, "order_id", ("OrderPlaced",), **kw)


def test_a_topic_is_tiered_unless_compacted_or_its_spec_says_otherwise():
    assert tiering(spec()) == {"remote.storage.enable": "true"}
    # Kafka cannot tier a compacted topic (nor compact,delete): left local.
    assert tiering(spec(config=(("cleanup.policy", "compact"),))) == {}
    assert tiering(spec(config=(("cleanup.policy", "compact,delete"),))) == {}
    # The spec's own word wins: false keeps it local.
    assert tiering(spec(config=(("remote.storage.enable", "false"),))) == {}


def test_an_existing_topic_is_tiered_only_on_a_broker_with_a_remote_tier():
    described = {"retention.ms": "604800000", "remote.storage.enable": "false"}
    assert config_changes(spec(), described) == []
    assert config_changes(spec(), described, tiered=True) == [
        ConfigChange("shop.orders", "remote.storage.enable", "false", "true")
    ]
    assert config_changes(spec(), {**described, "remote.storage.enable": "true"}, tiered=True) == []
    compacted = spec(config=(("cleanup.policy", "compact"),))
    assert config_changes(compacted, described, tiered=True) == []
