"""The HTTP services on the real broker and redis-server: ingest, then query what was written.

A folding thread stands in for the Spark processor (the same envelope, FoldWriter, applies the
records the ingest route wrote), so these tests need no JVM; tests/spark/test_serving.py runs
the real processor behind the same routes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic
from fastapi.testclient import TestClient

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.local_stack import LocalStack
from refold.deploy.serve_cli import build_app
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.auth import ApiKeyStore
from refold.services.client import InvalidEventsError, RefoldClient
from refold.services.consistency import decode_token

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class Stack:
    client: TestClient
    topic: str
    target: FoldTarget
    redis: redis.Redis
    kafka: dict[str, str]

    def fold(self, generation: int = 1) -> int:
        """Apply every record of the topic not yet applied (the processor's job)."""
        target = dataclasses.replace(self.target, generation=generation)
        records = [
            SourceRecord.of_message(m) for chunk in read_log(self.kafka, self.topic) for m in chunk
        ]
        return (
            FoldWriter(target, OrderStateProjection())
            .apply(records, batch_id=int(time.time() * 1000))
            .applied
        )


@pytest.fixture
def stack(redis_url, kafka_bootstrap, make_topic, unique) -> Iterator[Stack]:
    topic = make_topic(partitions=4, prefix="orders")
    prefix = f"test-{unique}"
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth="off", page_size=7, consistency_timeout_s=20),
    )
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    registry.create({"topics": f'["{topic}"]'}, live=True)
    context = ServiceContext(
        settings, client, topics=[dataclasses.replace(ORDERS, name=topic)], redis_url=redis_url
    )
    kafka = {"bootstrap.servers": kafka_bootstrap}
    target = FoldTarget(
        "order_state", 1, redis_url, prefix, tuple(kafka.items()), make_topic(1, prefix="dlq")
    )
    with TestClient(create_app(settings, context=context)) as http:
        yield Stack(http, topic, target, client, kafka)
    context.close()


def _batch(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"events": [{"type": t, "event": e} for t, e in events]}


def test_ingest_then_query_with_the_token_sees_the_write(stack: Stack) -> None:
    events = list(OrderSimulator(30, seed=3))
    answer = stack.client.post("/v1/events", json=_batch(events))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == len(events) == len(body["deliveries"])
    assert {d["topic"] for d in body["deliveries"]} == {stack.topic}
    token = body["consistency_token"]
    needed = decode_token(token)
    assert needed == {
        (stack.topic, p): max(d["offset"] for d in body["deliveries"] if d["partition"] == p) + 1
        for p in {d["partition"] for d in body["deliveries"]}
    }
    order = events[-1][1]["order_id"]
    url = f"/v1/processors/order_state/tables/orders/entities/{order}"
    # not applied yet: 409 at once with wait_ms=0, with the positions applied so far
    early = stack.client.get(url, params={"consistency_token": token, "wait_ms": 0})
    assert early.status_code == 409, early.text
    assert early.json()["error"]["code"] == "CONSISTENCY_NOT_MET"
    assert early.json()["error"]["generation"] == 1
    # the processor applies them while the query waits: the answer has the write
    folder = threading.Timer(0.5, stack.fold)
    folder.start()
    seen = stack.client.get(url, params={"consistency_token": token, "wait_ms": 15_000})
    folder.join()
    assert seen.status_code == 200, seen.text
    wanted = fold_all(OrderStateProjection(), events).states
    assert seen.json()["value"] == wanted[order]
    assert seen.json()["generation"] == 1
    positions = seen.json()["positions"]
    assert all(positions[f"{t}/{p}"] >= o for (t, p), o in needed.items())
    # ETag: the same data is 304
    etag = seen.headers["ETag"]
    again = stack.client.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304
    # min_positions, the readable form, beyond the log: 504 after the wait, with positions
    beyond = ",".join(f"{t}/{p}:{o + 100}" for (t, p), o in needed.items())
    late = stack.client.get(url, params={"min_positions": beyond, "wait_ms": 300})
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "CONSISTENCY_TIMEOUT"
    assert set(late.json()["error"]["missing"]) == {f"{t}/{p}" for t, p in needed}
    # a damaged token, or positions that are not <topic>/<partition>:<offset>: 400
    for params in (
        {"consistency_token": "v1.not-base64!"},
        {"consistency_token": "nope"},
        {"min_positions": f"{stack.topic}/0:\u00b2"},
        {"min_positions": f"{stack.topic}/\u0663:1"},
    ):
        bad = stack.client.get(url, params=params)
        assert bad.status_code == 400, (params, bad.text)
        assert bad.json()["error"]["code"] == "CONSISTENCY_TOKEN_INVALID"
    # batch get: one generation, null for a missing key
    keys = [*sorted(wanted)[:5], "no-such-order"]
    many = stack.client.post(
        "/v1/processors/order_state/tables/orders/entities:batch-get", json={"keys": keys}
    )
    assert many.status_code == 200
    assert many.json()["values"] == {k: wanted.get(k) for k in keys}
    missing = stack.client.get("/v1/processors/order_state/tables/orders/entities/no-such")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "ENTITY_NOT_FOUND"
    counters = stack.client.get("/v1/processors/order_state/aggregates/order_totals")
    assert counters.status_code == 200, counters.text
    totals = fold_all(OrderStateProjection(), events).aggregate
    assert counters.json()["counters"] == {k: v for k, v in totals.items() if v}


def test_an_invalid_event_refuses_the_whole_request_naming_every_field(stack: Stack) -> None:
    events = list(OrderSimulator(3, seed=5))[:3]
    broken = [{"type": t, "event": dict(e)} for t, e in events]
    broken[1]["event"]["customer_id"] = 17  # a string field
    broken[2]["event"].pop("order_id")
    broken.append({"type": "NoSuchEvent", "event": {}})
    answer = stack.client.post("/v1/events", json={"events": broken})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "EVENT_INVALID"
    assert [e["index"] for e in error["errors"]] == [1, 2, 3]
    assert "customer_id" in error["errors"][0]["fields"]
    assert "order_id" in " ".join(error["errors"][1]["problems"])
    assert error["errors"][2]["code"] == "EVENT_TYPE_UNKNOWN"
    # an event larger than a Kafka message may be, after a valid one: 422, nothing sent
    huge = {**events[0][1], "customer_id": "c" * 1_100_000}
    too_big = stack.client.post("/v1/events", json=_batch([events[0], ("OrderPlaced", huge)]))
    assert too_big.status_code == 422, too_big.text
    assert too_big.json()["error"]["errors"][0]["code"] == "EVENT_TOO_LARGE"
    # nothing of either request was sent
    assert sum(len(c) for c in read_log(stack.kafka, stack.topic)) == 0
    # a request that is not an event at all
    assert stack.client.post("/v1/events", json={"nope": 1}).status_code == 422


def test_pagination_is_complete_without_duplicates_while_a_flip_happens(stack: Stack) -> None:
    events = list(OrderSimulator(60, seed=9))
    assert stack.client.post("/v1/events", json=_batch(events)).status_code == 200
    stack.fold(1)
    registry = GenerationRegistry.of(stack.redis, "order_state", stack.target.key_prefix)
    wanted = fold_all(OrderStateProjection(), events).states
    url = "/v1/processors/order_state/tables/orders/entities"
    first = stack.client.get(url, params={"limit": 10}).json()
    seen = [item["key"] for item in first["items"]]
    # a replay builds generation 2 (here: the same fold) and flips readers to it mid-scan
    new = registry.create({"topics": f'["{stack.topic}"]'})
    stack.fold(new)
    registry.flip(new)
    cursor, pages = first["next_cursor"], 1
    while cursor is not None:
        page = stack.client.get(url, params={"limit": 10, "cursor": cursor}).json()
        assert page["generation"] == 1  # the scan stays on the generation it began with
        seen += [item["key"] for item in page["items"]]
        cursor, pages = page["next_cursor"], pages + 1
    assert pages > 3
    assert len(seen) == len(set(seen))
    assert set(seen) == set(wanted)
    # a new scan reads the new generation
    assert stack.client.get(url).json()["generation"] == new


def test_a_plain_read_answers_as_the_declared_route_and_follows_a_flip_at_once(
    stack: Stack,
) -> None:
    events = list(OrderSimulator(20, seed=14))
    assert stack.client.post("/v1/events", json=_batch(events)).status_code == 200
    stack.fold(1)
    wanted = fold_all(OrderStateProjection(), events).states
    key = sorted(wanted)[0]
    url = f"/v1/processors/order_state/tables/orders/entities/{key}"
    # No query parameter: the hot path (services/query/hot.py). wait_ms: the declared route.
    plain, declared = stack.client.get(url), stack.client.get(url, params={"wait_ms": 0})
    assert plain.status_code == declared.status_code == 200
    assert plain.json() == declared.json()
    assert plain.json()["value"] == wanted[key]
    assert plain.headers["ETag"] == declared.headers["ETag"]
    again = stack.client.get(url, headers={"If-None-Match": plain.headers["ETag"]})
    assert (again.status_code, again.content) == (304, b"")
    missing = stack.client.get(f"{url}-nope")
    assert missing.status_code == 404
    assert missing.json() == stack.client.get(f"{url}-nope", params={"wait_ms": 0}).json()
    assert missing.json()["error"]["generation"] == 1
    assert (
        stack.client.get("/v1/processors/order%20state/tables/orders/entities/x").status_code == 422
    )
    # A replay's generation 2, flipped to before it is folded: the next read sees it.
    registry = GenerationRegistry.of(stack.redis, "order_state", stack.target.key_prefix)
    new = registry.create({"topics": f'["{stack.topic}"]'})
    registry.flip(new)
    flipped = stack.client.get(url)
    assert flipped.status_code == 404
    assert flipped.json()["error"]["generation"] == new
    stack.fold(new)
    after = stack.client.get(url)
    assert (after.status_code, after.json()["generation"]) == (200, new)
    assert after.json()["value"] == wanted[key]
    assert after.headers["ETag"] != plain.headers["ETag"]  # it names the generation


def test_a_broker_that_does_not_answer_gets_a_503_and_nothing_acknowledged_is_lost(
    private_stack: LocalStack, unique: str
) -> None:
    bootstrap = private_stack.bootstrap_servers
    topic = dataclasses.replace(ORDERS, name=f"orders-{unique}", partitions=4)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic.name, num_partitions=4)])[topic.name].result(timeout=30)
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        redis=RedisSettings(url=private_stack.redis_url, key_prefix=f"test-{unique}"),
        serve=HttpSettings(auth="off", ingest_timeout_s=3),
    )
    context = ServiceContext(settings, redis_client(private_stack.redis_url), [topic])
    events = list(OrderSimulator(10, seed=6))
    accepted, frozen = events[:20], events[20:30]
    with TestClient(create_app(settings, context=context)) as http:
        assert http.post("/v1/events", json=_batch(accepted)).status_code == 200
        private_stack.pause("kafka")  # the broker holds its connections but never answers
        try:
            answer = http.post("/v1/events", json=_batch(frozen))
        finally:
            private_stack.pause("kafka", paused=False)
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) > 0
        error = answer.json()["error"]
        assert error["code"] == "PUBLISH_FAILED"
        assert [u["index"] for u in error["unacknowledged"]] == list(range(len(frozen)))
        assert "not acknowledged" in error["message"]
        # the service recovers once the broker answers; what was acknowledged is in the log
        again = http.post("/v1/events", json=_batch(frozen))
        assert again.status_code == 200, again.text
    context.close()
    kafka = {"bootstrap.servers": bootstrap}
    landed = [
        EventCodec().decode(m.value()).data["event_id"]
        for chunk in read_log(kafka, topic.name)
        for m in chunk
    ]
    assert {e["event_id"] for _t, e in [*accepted, *frozen]} <= set(landed)
    assert len(landed) <= len(accepted) + 2 * len(frozen)


def test_scopes_are_enforced_on_the_real_routes_and_the_client_reads_its_writes(
    redis_url, kafka_bootstrap, make_topic, unique
) -> None:
    topic = make_topic(partitions=4, prefix="orders")
    prefix = f"test-{unique}"
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth="keys"),
    )
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    registry.create({"topics": f'["{topic}"]'}, live=True)
    keys = ApiKeyStore(client, prefix)
    ingest, query, admin = (keys.add(s, [s]) for s in ("ingest", "query", "admin"))
    context = ServiceContext(settings, client, [dataclasses.replace(ORDERS, name=topic)])
    events = list(OrderSimulator(5, seed=12))
    entity = "/v1/processors/order_state/tables/orders/entities/o-1"
    with TestClient(build_app(settings, context)) as http:
        nobody = http.get(entity)
        assert nobody.status_code == 401
        assert nobody.json()["error"]["code"] == "UNAUTHENTICATED"
        assert nobody.headers["WWW-Authenticate"].startswith("Bearer")
        for key, method, path, allowed in (
            (ingest, "POST", "/v1/events", True),
            (ingest, "GET", entity, False),
            (query, "GET", entity, True),
            (query, "POST", "/v1/events", False),
            (query, "POST", "/v1/processors/order_state/rollback", False),
            (admin, "GET", entity, True),
        ):
            body = _batch(events[:1]) if path == "/v1/events" else None
            answer = http.request(
                method, path, json=body, headers={"Authorization": f"Bearer {key}"}
            )
            if allowed:
                assert answer.status_code not in (401, 403), (path, answer.text)
            else:
                assert answer.status_code == 403, (path, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "FORBIDDEN"
                assert "needs" in error["message"]
        keys.revoke("query")
        time.sleep(1.2)  # the per-app verification cache holds a key ~1 s
        revoked = http.get(entity, headers={"X-API-Key": query})
        assert revoked.status_code == 401

        # the typed client: ingest, then read the write with its token (folded meanwhile)
        target = FoldTarget(
            "order_state",
            1,
            redis_url,
            prefix,
            (("bootstrap.servers", kafka_bootstrap),),
            make_topic(1, prefix="dlq"),
        )
        stack = Stack(http, topic, target, client, {"bootstrap.servers": kafka_bootstrap})
        with RefoldClient(str(http.base_url), admin, http_client=http) as refold:
            written = refold.ingest(events)
            assert len(written.deliveries) == len(events)
            folder = threading.Timer(0.3, stack.fold)
            folder.start()
            order = events[-1][1]["order_id"]
            seen = refold.entity(
                "order_state", "orders", order, consistency_token=written.consistency_token
            )
            folder.join()
            wanted = fold_all(OrderStateProjection(), events).states
            assert seen.value == wanted[order]
            assert dict(refold.scan("order_state", "orders")) == wanted
            with pytest.raises(InvalidEventsError) as refused:
                refold.ingest([("OrderPlaced", {"order_id": 1})])
            assert refused.value.status == 422
    context.close()


def test_a_generation_named_in_the_query_is_read_instead_of_the_live_one(stack: Stack) -> None:
    """``?generation=N``: a state as of a moment (``replay --until``) read over HTTP."""
    events = list(OrderSimulator(40, seed=45))
    then, later = events[: len(events) // 2], events[len(events) // 2 :]
    registry = GenerationRegistry.of(stack.redis, "order_state", stack.target.key_prefix)
    assert stack.client.post("/v1/events", json=_batch(then)).status_code == 200
    as_of = registry.create({"topics": f'["{stack.topic}"]', "as_of": "offsets"})
    stack.fold(as_of)
    assert registry.keep_as_of(as_of)
    assert stack.client.post("/v1/events", json=_batch(later)).status_code == 200
    stack.fold(1)
    was = fold_all(OrderStateProjection(), then)
    now = fold_all(OrderStateProjection(), events)
    key = next(k for k in sorted(was.states) if was.states[k] != now.states[k])
    base = "/v1/processors/order_state"
    url = f"{base}/tables/orders/entities/{key}"
    named = stack.client.get(url, params={"generation": as_of})
    assert (named.status_code, named.json()["generation"]) == (200, as_of)
    assert named.json()["value"] == was.states[key]
    assert named.headers["X-Refold-Generation"] == str(as_of)
    assert stack.client.get(url).json()["value"] == now.states[key]  # the live one
    batch = stack.client.post(
        f"{base}/tables/orders/entities:batch-get",
        params={"generation": as_of},
        json={"keys": [key]},
    )
    assert batch.json()["values"] == {key: was.states[key]}
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"generation": as_of, "limit": 50}
        if cursor is not None:
            params["cursor"] = cursor
        page = stack.client.get(f"{base}/tables/orders/entities", params=params).json()
        assert page["generation"] == as_of
        pages += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert {item["key"]: item["value"] for item in pages} == was.states
    totals = stack.client.get(f"{base}/aggregates/order_totals", params={"generation": as_of})
    assert totals.json()["counters"] == dict(was.aggregate)
    unknown = stack.client.get(url, params={"generation": 99})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "GENERATION_UNKNOWN"
