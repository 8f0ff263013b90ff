"""Fixtures of the integration layer (the stack itself comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.runtime.envelope import FoldTarget


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


@pytest.fixture
def private_stack(tmp_path) -> Iterator[LocalStack]:
    """A stack of this test alone: the test freezes its broker."""
    with LocalStack(tmp_path / "stack", free_port(), free_port(), redis_persistent=False) as stack:
        try:
            yield stack
        finally:
            # Continue it in case the test failed while it was stopped, then end it at once:
            # its memory storage holds nothing worth a graceful stop, which would wait for the
            # connections that the test's clients (kept alive by the caught error) still hold.
            stack.pause("kafka", paused=False)
            stack.kill("kafka")
