"""schemathesis against the OpenAPI schema of the whole app: no request makes it fail with a 500.

The app runs with every route (the replay control routes too, except the one that starts a
rebuild process), on the real broker and redis-server, with a live order_state generation that
has state, so that generated requests reach the readers, not only 404s. Ingest publishes to a
topic of this test alone.
"""

from __future__ import annotations

import dataclasses

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from refold.contracts.commerce import ORDERS
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.serve_cli import build_app
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection
from refold.services.api.app import close_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext

pytestmark = pytest.mark.integration


@schemathesis.check
def no_internal_error(ctx, response, case) -> None:
    """A 500 is a defect; 503/504 are documented answers (broker down, consistency wait)."""
    if response.status_code == 500:
        msg = f"500 from {case.method} {case.formatted_path}: {response.text[:500]}"
        raise AssertionError(msg)


@pytest.fixture
def api_schema(redis_url, kafka_bootstrap, make_topic, unique, tmp_path):
    prefix = f"test-{unique}"
    topic = make_topic(partitions=4, prefix="orders")
    stack = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        state_dir=tmp_path,
        serve=HttpSettings(auth="off", consistency_timeout_s=0.2),
    )
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    live = registry.create({"topics": f'["{topic}"]'}, live=True)
    folded = fold_all(OrderStateProjection(), list(OrderSimulator(5, seed=1)))
    keys = registry.keys(live)
    for key, state in folded.states.items():
        client.set(keys.table("orders", key), orjson.dumps(state))
    registry.set_positions(live, {f"{topic}/0": 3})
    context = ServiceContext(stack, client, [dataclasses.replace(ORDERS, name=topic)], redis_url)
    app = build_app(stack, context)
    yield schemathesis.openapi.from_asgi("/openapi.json", app).exclude(
        method="POST", path_regex=r"^/v1/processors/\{name\}/replays$"
    )
    # The Kafka clients must not outlive the test: its topics are deleted afterwards, and a
    # librdkafka client left on deleted topics crashed a later test's client (segfault).
    close_app(app)
    context.close()


def test_no_request_makes_the_api_fail(api_schema) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=60,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case) -> None:
            case.call_and_validate(checks=[no_internal_error])

        call()
