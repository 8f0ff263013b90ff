"""Fixtures of the integration layer (the stack itself comes from tests/conftest.py)."""

from __future__ import annotations

import pytest

from processors.runtime.envelope import FoldTarget


@pytest.fixture
def target(redis_url, kafka_bootstrap, make_topic, unique) -> FoldTarget:
    """Generation 1 of order_state under a unique key prefix, with its own dead-letter topic."""
    dlq = make_topic(partitions=1, prefix="dlq")
    return FoldTarget(
        "order_state",
        1,
        redis_url,
        f"test-{unique}",
        (("bootstrap.servers", kafka_bootstrap),),
        dlq,
    )
