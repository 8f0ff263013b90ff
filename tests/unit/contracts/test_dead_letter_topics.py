"""A processor's dead-letter topic: one rule, used by the processor and by every command."""

from __future__ import annotations

from refold.contracts.topics import dead_letter_spec, dead_letter_topic


def test_the_option_names_the_topic_else_the_processor_s_default():
    assert dead_letter_topic("order_state") == "order_state.dlq"
    assert dead_letter_topic("order_state", None) == "order_state.dlq"
    assert dead_letter_topic("order_state", "") == "order_state.dlq"  # an empty env value
    assert dead_letter_topic("order_state", "orders-dead") == "orders-dead"


def test_the_spec_follows_the_rule_and_keeps_one_partition():
    assert dead_letter_spec("order_state").name == "order_state.dlq"
    custom = dead_letter_spec("webhooks", "webhooks.webhook-dlq")
    assert (custom.name, custom.partitions, custom.key_field) == (
        "webhooks.webhook-dlq",
        1,
        "(original key)",
    )
