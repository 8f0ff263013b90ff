"""The HTTP services over a generation sharded by partition id: query, monitor, `refold dlq`.

Events go in through the ingest route (refold's producer puts an order on the partition of its
id's murmur2), the fold writer applies them to a generation created with ``shards`` in its meta
(each partition id's entities, positions, stats and letters under its shard's hash tag), and the
answers are compared with the oracle. Run here on a single redis-server, and again on a real
local cluster by ``test_redis_cluster.py``, which imports these tests.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import SHARDS_FIELD, GenerationRegistry
from refold.deploy.cli import main as refold_main
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.web_sessions.config import WEB_SESSIONS
from refold.processors.web_sessions.projection import WebSessionsProjection
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.consistency import decode_token
from refold.services.query.pagination import ScanCursor
from refold.services.reader.window_reader import WindowReader
from tests.integration.test_entity_timers import _log, _target
from tests.integration.test_serving import Stack, _batch
from tests.support.waiting import assert_eventually

pytestmark = pytest.mark.integration

SHARDS = 4
ENTITIES = "/v1/processors/order_state/tables/orders/entities"


@pytest.fixture
def sharded_stack(redis_url, kafka_bootstrap, make_topic, unique) -> Iterator[Stack]:
    """The HTTP app over order_state, whose generation 1 is sharded by its 4 partition ids."""
    topic = make_topic(partitions=SHARDS, prefix="orders")
    prefix = f"test-{unique}"
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth="off", page_size=7, consistency_timeout_s=20),
    )
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    registry.create({"topics": f'["{topic}"]', SHARDS_FIELD: SHARDS}, live=True)
    context = ServiceContext(
        settings, client, topics=[dataclasses.replace(ORDERS, name=topic)], redis_url=redis_url
    )
    kafka = {"bootstrap.servers": kafka_bootstrap}
    target = FoldTarget(
        "order_state",
        1,
        redis_url,
        prefix,
        tuple(kafka.items()),
        make_topic(1, prefix="dlq"),
        shards=SHARDS,
    )
    with TestClient(create_app(settings, context=context)) as http:
        yield Stack(http, topic, target, client, kafka)
    context.close()


def _scan(stack: Stack, cursor: str | None, pages: int = 0) -> tuple[list[dict], int, set[int]]:
    """Follow ``cursor`` to the end: the items, the pages, and the generations answered."""
    items, generations = [], set()
    while cursor is not None:
        page = stack.client.get(ENTITIES, params={"limit": 10, "cursor": cursor})
        assert page.status_code == 200, page.text
        body = page.json()
        items += body["items"]
        generations.add(body["generation"])
        cursor, pages = body["next_cursor"], pages + 1
    return items, pages, generations


def test_pages_over_the_shards_are_complete_without_duplicates_while_a_flip_happens(
    sharded_stack: Stack,
) -> None:
    stack = sharded_stack
    events = list(OrderSimulator(90, seed=19))
    assert stack.client.post("/v1/events", json=_batch(events)).status_code == 200
    stack.fold(1)
    wanted = fold_all(OrderStateProjection(), events).states
    assert {key_partition(k, SHARDS) for k in wanted} == set(range(SHARDS))  # every shard
    first = stack.client.get(ENTITIES, params={"limit": 10}).json()
    assert first["generation"] == 1
    # A replay builds generation 2, sharded too (here: the same fold), and flips to it mid-scan.
    registry = GenerationRegistry.of(stack.redis, "order_state", stack.target.key_prefix)
    new = registry.create({"topics": f'["{stack.topic}"]', SHARDS_FIELD: SHARDS})
    stack.fold(new)
    registry.flip(new)
    rest, pages, generations = _scan(stack, first["next_cursor"], 1)
    assert generations == {1}  # the scan stays on the generation it began with
    seen = [*first["items"], *rest]
    keys = [item["key"] for item in seen]
    assert len(keys) == len(set(keys))
    assert {item["key"]: item["value"] for item in seen} == wanted
    assert pages >= len(wanted) // 10
    # A cursor names its shard: one beyond the generation's shards is not a cursor of it.
    beyond = ScanCursor("order_state", "orders", 1, 0, SHARDS).encode()
    refused = stack.client.get(ENTITIES, params={"cursor": beyond})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "CURSOR_INVALID")
    # A new scan reads the new generation, whole, and says its positions (every shard's).
    again = stack.client.get(ENTITIES, params={"limit": 1000}).json()
    items, _pages, generations = _scan(stack, again["next_cursor"])
    assert again["generation"] == new
    assert generations <= {new}
    assert {i["key"]: i["value"] for i in [*again["items"], *items]} == wanted
    assert set(again["positions"]) == {f"{stack.topic}/{p}" for p in range(SHARDS)}


def test_a_token_of_other_partitions_is_read_from_their_shards_and_aggregates_add_up(
    sharded_stack: Stack,
) -> None:
    stack = sharded_stack
    events = list(OrderSimulator(40, seed=23))
    answer = stack.client.post("/v1/events", json=_batch(events))
    assert answer.status_code == 200, answer.text
    token = answer.json()["consistency_token"]
    needed = decode_token(token)
    assert {p for _t, p in needed} == set(range(SHARDS))  # the premise: every partition
    order = events[-1][1]["order_id"]
    own = key_partition(order, SHARDS)
    url = f"{ENTITIES}/{order}"
    early = stack.client.get(url, params={"consistency_token": token, "wait_ms": 0})
    assert early.status_code == 409, early.text
    # The processor applies them while the query waits; the entity's own shard holds one
    # partition's positions, the others are read from their shards.
    folder = threading.Timer(0.5, stack.fold)
    folder.start()
    seen = stack.client.get(url, params={"consistency_token": token, "wait_ms": 15_000})
    folder.join()
    assert seen.status_code == 200, seen.text
    oracle = fold_all(OrderStateProjection(), events)
    assert seen.json()["value"] == oracle.states[order]
    positions = seen.json()["positions"]
    assert {f"{t}/{p}": o for (t, p), o in needed.items()} == positions  # all applied, exactly
    # The plain read (the hot path): the entity's partition's positions only.
    plain = stack.client.get(url)
    assert plain.json()["value"] == oracle.states[order]
    assert plain.json()["positions"] == {f"{stack.topic}/{own}": needed[stack.topic, own]}
    assert plain.headers["ETag"] == seen.headers["ETag"]
    # Another partition's position: applied, at once; beyond its end, 504 naming it as applied.
    other = (own + 1) % SHARDS
    at = f"{stack.topic}/{other}"
    applied = stack.client.get(url, params={"min_positions": f"{at}:{needed[stack.topic, other]}"})
    assert applied.status_code == 200, applied.text
    assert applied.json()["positions"][at] == needed[stack.topic, other]
    late = stack.client.get(
        url, params={"min_positions": f"{at}:{needed[stack.topic, other] + 5}", "wait_ms": 200}
    )
    assert late.status_code == 504, late.text
    assert late.json()["error"]["missing"] == {at: needed[stack.topic, other] + 5}
    assert late.json()["error"]["positions"][at] == needed[stack.topic, other]
    # A batch get over several shards, and the aggregate, added up over the shards.
    keys = [*sorted(oracle.states)[:9], "no-such-order"]
    many = stack.client.post(f"{ENTITIES}:batch-get", json={"keys": keys})
    assert many.status_code == 200, many.text
    assert many.json()["values"] == {k: oracle.states.get(k) for k in keys}
    counters = stack.client.get(
        "/v1/processors/order_state/aggregates/order_totals", params={"consistency_token": token}
    )
    assert counters.status_code == 200, counters.text
    assert counters.json()["counters"] == {k: v for k, v in oracle.aggregate.items() if v}
    assert counters.json()["positions"] == positions


def test_monitor_metrics_and_dlq_list_gather_the_shards(
    sharded_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = sharded_stack
    events = list(OrderSimulator(60, seed=29, anomaly_rate=0.1))
    answer = stack.client.post("/v1/events", json=_batch(events))
    assert answer.status_code == 200, answer.text
    ends = {p: o for (_t, p), o in decode_token(answer.json()["consistency_token"]).items()}
    stack.fold(1)
    oracle = fold_all(OrderStateProjection(), events)
    assert oracle.rejected, "the premise: some events are refused (dead letters)"
    listed = stack.client.get("/v1/processors/order_state/generations")
    assert listed.status_code == 200, listed.text

    def lag_known() -> bool:
        # A loaded broker can miss the probe's 2 s budget: the route then rightly leaves lag
        # out (test_monitor's _warm_up waits the same way).
        answer = stack.client.get("/v1/processors/order_state/generations").json()
        return answer["generations"][0]["lag_records"] is not None

    assert_eventually(
        lag_known, timeout=30, interval=0.5, message="the broker probe never answered"
    )
    (gen,) = stack.client.get("/v1/processors/order_state/generations").json()["generations"]
    assert (gen["generation"], gen["applied"], gen["lag_records"]) == (1, len(events), 0)
    stats = stack.client.get("/v1/processors/order_state/stats").json()["generations"][0]
    applied = len(events) - len(oracle.rejected) - oracle.passed
    assert stats["events"] == applied
    assert stats["dead_letters"] == {"rejected": len(oracle.rejected)}
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(stack.client.get("/metrics").text):
        for s in family.samples:
            if s.labels.get("processor") == "order_state":
                samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    labels = (("generation", "1"), ("processor", "order_state"))
    assert samples["refold_events_applied_total"][labels] == applied
    for partition in ends:
        at = (labels[0], ("partition", str(partition)), labels[1], ("topic", stack.topic))
        assert samples["refold_lag_records"][at] == 0
    # `refold dlq list`: the letters of every shard's index.
    monkeypatch.setenv("REFOLD_REDIS__URL", stack.target.redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", stack.target.key_prefix)
    capsys.readouterr()
    assert refold_main(["dlq", "list", "--processor", "order_state", "--json"]) == 0
    dlq = json.loads(capsys.readouterr().out)
    assert (dlq["generation"], dlq["letters"]) == (1, len(oracle.rejected))
    assert [(r["reason"], r["count"]) for r in dlq["reasons"]] == [
        ("rejected", len(oracle.rejected))
    ]
    # The premise: the letters are in several shards' indexes.
    keys = GenerationRegistry.of(stack.redis, "order_state", stack.target.key_prefix).keys(1)
    per_shard = [int(stack.redis.hlen(k.dead_letters)) for k in keys.each_shard()]
    assert sum(per_shard) == len(oracle.rejected)
    assert sum(1 for n in per_shard if n) > 1


def test_the_watermark_gathers_every_shards_clocks(target, redis_url, make_topic) -> None:
    events = list(ClickstreamSimulator(150, seed=5))
    logs, decoded, published = _log(events)
    projection = WebSessionsProjection(closed_topic=make_topic(partitions=4, prefix="closed"))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "web_sessions", target.key_prefix)
    assert registry.create({SHARDS_FIELD: SHARDS}, live=True) == 1
    chosen = _target(target, "web_sessions", WEB_SESSIONS, ("pv", "se"), 1)
    FoldWriter(dataclasses.replace(chosen, shards=SHARDS), projection).apply(published, 0)
    event_time = WEB_SESSIONS.event_time
    assert event_time is not None
    # The plain answer: per partition, the largest event time of its records.
    clocks: dict[str, int] = {}
    for (topic, partition, _offset), (_type, data) in decoded.items():
        at = f"{topic}/{partition}"
        clocks[at] = max(clocks.get(at, 0), event_time_ms(data, event_time.field))
    assert len(clocks) == len(logs) == 2 * SHARDS  # the premise: every shard has both topics
    reader = WindowReader(
        client, "web_sessions", (), (), target.key_prefix, lateness_ms=event_time.lateness_ms
    )
    view = reader.watermark()
    assert view.positions == {tp: len(log) for tp, log in logs.items()}
    assert view.value.clocks == clocks
    assert view.value.watermark == min(clocks.values()) - event_time.lateness_ms
