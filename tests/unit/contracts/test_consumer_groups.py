"""The consumer group that mirrors a generation: one per deployment (key prefix)."""

from __future__ import annotations

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.processors import consumer_group


def test_the_default_deployment_keeps_the_documented_name():
    assert consumer_group("order_state", 3, DEFAULT_KEY_PREFIX) == "refold.order_state.g3"


def test_two_deployments_on_one_cluster_never_share_a_group():
    groups = {consumer_group("order_state", 1, prefix) for prefix in ("refold", "staging", "t-1")}
    assert groups == {
        "refold.order_state.g1",
        "refold.staging.order_state.g1",
        "refold.t-1.order_state.g1",
    }
