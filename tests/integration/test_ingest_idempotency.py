"""Idempotent ingest: a retried ``POST /v1/events`` is answered, not produced again.

On the app under uvicorn, a real broker and Redis, through the SDK as an application uses it:

- the same ``Idempotency-Key`` and events: the first answer again, nothing written twice;
- the same key with other events: 409, nothing written;
- a request the broker could not fully acknowledge (one of its topics is missing): the retry
  with the key sends only the events without a delivery, and answers with all of them;
- a key held by a running request: 409 ``IDEMPOTENCY_KEY_IN_USE``; keys are per caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import delete_topics, ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.client import IdempotencyConflictError, NotAcknowledgedError, RefoldClient
from refold.services.ingest.idempotency import body_sha256
from tests.support.served import served

pytestmark = pytest.mark.integration

# OrderPlaced goes to one topic, every other order event to another (missing in one test).
_PLACED = ("OrderPlaced",)


@dataclasses.dataclass
class Ingest:
    url: str
    kafka: KafkaSettings
    placed: str
    rest: str
    context: ServiceContext

    def written(self, topic: str) -> int:
        with LogOffsets(self.kafka.as_librdkafka()) as offsets:
            return sum(offsets.end_offsets([(topic, p) for p in range(2)]).values())


@pytest.fixture
def ingest(kafka_bootstrap, redis_url, make_topic, unique) -> Iterator[Ingest]:
    placed = make_topic(partitions=2, prefix="placed")
    rest = f"rest-{unique}"  # created by the test that needs it
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    settings = ServeSettings(
        kafka=kafka,
        redis=RedisSettings(url=redis_url, key_prefix=f"test-{unique}"),
        serve=HttpSettings(auth="off", ingest_timeout_s=3),
    )
    others = tuple(t for t in ORDERS.event_types if t not in _PLACED)
    topics = [
        dataclasses.replace(ORDERS, name=placed, partitions=2, event_types=_PLACED),
        dataclasses.replace(ORDERS, name=rest, partitions=2, event_types=others),
    ]
    context = ServiceContext(settings, redis_client(redis_url), topics)
    try:
        with served(create_app(settings, context=context)) as url:
            yield Ingest(url, kafka, placed, rest, context)
    finally:
        context.close()
        delete_topics({"bootstrap.servers": kafka_bootstrap}, [rest])  # if a test made it


def _placed(n: int, seed: int) -> list[tuple[str, dict]]:
    return [e for e in OrderSimulator(n, seed=seed) if e[0] in _PLACED][:n]


def test_the_same_key_and_events_are_answered_again_and_written_once(ingest):
    events = _placed(5, seed=1)
    with RefoldClient(ingest.url, timeout=30) as client:
        first = client.ingest(events, idempotency_key="order-batch-1")
        again = client.ingest(events, idempotency_key="order-batch-1")
        assert not first.replayed
        assert again.replayed
        assert (again.deliveries, again.consistency_token) == (
            first.deliveries,
            first.consistency_token,
        )
        assert ingest.written(ingest.placed) == 5
        # Other events under the same key: refused, nothing written.
        with pytest.raises(IdempotencyConflictError) as refused:
            client.ingest(_placed(5, seed=2), idempotency_key="order-batch-1")
        assert refused.value.code == "IDEMPOTENCY_KEY_REUSED"
        assert ingest.written(ingest.placed) == 5
        # Without a key of its own, every call is a new request (a new key each time).
        other = client.ingest(events)
        assert other.idempotency_key not in ("", "order-batch-1")
        assert ingest.written(ingest.placed) == 10


def test_a_partly_acknowledged_request_is_completed_by_its_retry_without_duplicates(ingest):
    events = list(OrderSimulator(4, seed=3))[:12]
    placed = sum(1 for t, _ in events if t in _PLACED)
    assert 0 < placed < len(events)
    with RefoldClient(ingest.url, timeout=30) as client:
        # The other events' topic does not exist yet: the broker cannot take them in time.
        with pytest.raises(NotAcknowledgedError) as partly:
            client.ingest(events, idempotency_key="mixed-1", attempts=1)
        assert {u["type"] for u in partly.value.unacknowledged} <= set(ORDERS.event_types)
        assert len(partly.value.unacknowledged) == len(events) - placed
        assert ingest.written(ingest.placed) == placed
        ensure_topics(
            {"bootstrap.servers": ingest.kafka.bootstrap_servers},
            [dataclasses.replace(ORDERS, name=ingest.rest, partitions=2)],
        )
        done = client.ingest(events, idempotency_key="mixed-1")
    assert done.accepted == len(events)
    assert ingest.written(ingest.placed) == placed  # not sent again
    assert ingest.written(ingest.rest) == len(events) - placed
    first = partly.value.deliveries
    assert [d for d in first if d is not None] == [
        d for d, before in zip(done.deliveries, first, strict=True) if before is not None
    ]


def test_a_running_request_holds_its_key_and_keys_are_per_caller(ingest):
    store = ingest.context.idempotency()
    events = _placed(2, seed=4)
    assert store.claim("-", "held", body_sha256(events)).outcome == "new"  # a request running
    with (
        RefoldClient(ingest.url, timeout=30) as client,
        pytest.raises(IdempotencyConflictError) as held,
    ):
        client.ingest(events, idempotency_key="held", attempts=1)
    assert held.value.code == "IDEMPOTENCY_KEY_IN_USE"
    assert held.value.headers.get("Retry-After") == "1"
    assert ingest.written(ingest.placed) == 0
    # Another API key's "held" is another record.
    assert store.claim("rfk-other", "held", body_sha256(events)).outcome == "new"
