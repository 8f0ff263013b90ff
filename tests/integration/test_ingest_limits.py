"""Ingest limits, tried as a hostile client would, on the app under uvicorn (real broker, Redis).

- a body over ``max_request_bytes`` gets a 413 naming the limit before anything parses it,
  whether it declares its length or streams it in chunks;
- a batch of many bad events answers the first ``max_reported_errors`` refusals and a count of
  the rest, not megabytes of errors;
- the worker answers ``/health/live`` at once while a hostile upload is refused.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from refold.contracts.commerce import ORDERS
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.client import InvalidEventsError, RefoldClient
from tests.support.served import served

pytestmark = pytest.mark.integration

_LIMIT = 64 * 1024


@pytest.fixture
def base_url(kafka_bootstrap, redis_url, make_topic, unique) -> Iterator[str]:
    topic = make_topic(partitions=2, prefix="orders")
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=f"test-{unique}"),
        serve=HttpSettings(auth="off", max_request_bytes=_LIMIT, max_reported_errors=10),
    )
    context = ServiceContext(
        settings, redis_client(redis_url), [dataclasses.replace(ORDERS, name=topic)]
    )
    try:
        with served(create_app(settings, context=context)) as url:
            yield url
    finally:
        context.close()


def _bad_events(count: int) -> bytes:
    events = [{"type": "OrderPlaced", "event": {"order_id": i}} for i in range(count)]
    return json.dumps({"events": events}).encode()


def test_a_body_over_the_limit_is_refused_before_it_is_parsed(base_url):
    declared = httpx.post(
        f"{base_url}/v1/events",
        content=b"{" + b" " * (5 * _LIMIT) + b"}",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert declared.status_code == 413
    error = declared.json()["error"]
    assert error["code"] == "REQUEST_TOO_LARGE"
    assert error["max_request_bytes"] == _LIMIT
    assert "max_request_bytes" in error["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is met while reading
        yield b'{"events": ['
        for _ in range(200):
            yield b'{"type": "OrderPlaced", "event": {"order_id": "x"}},' * 20

    streamed = httpx.post(
        f"{base_url}/v1/events",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert streamed.status_code == 413
    assert streamed.json()["error"]["code"] == "REQUEST_TOO_LARGE"


def test_many_bad_events_answer_the_first_refusals_and_a_count_of_the_rest(base_url):
    body = _bad_events(500)
    assert len(body) < _LIMIT  # the premise: under the byte limit
    answer = httpx.post(
        f"{base_url}/v1/events",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "EVENT_INVALID"
    assert len(error["errors"]) == 10
    assert error["errors_omitted"] == 490
    assert [e["index"] for e in error["errors"]] == list(range(10))
    assert "500 of 500 events refused" in error["message"]
    assert len(answer.content) < 20_000
    with RefoldClient(base_url) as client, pytest.raises(InvalidEventsError) as raised:
        client.ingest([("OrderPlaced", {"order_id": i}) for i in range(50)])
    assert (len(raised.value.errors), raised.value.errors_omitted) == (10, 40)


def test_the_worker_answers_health_while_a_hostile_upload_is_refused(base_url):
    refused: list[int] = []

    def slow_upload() -> None:
        def trickle() -> Iterator[bytes]:
            yield b'{"events": ['
            for _ in range(400):
                yield b" " * 1024
                time.sleep(0.005)

        answer = httpx.post(
            f"{base_url}/v1/events",
            content=trickle(),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        refused.append(answer.status_code)

    upload = threading.Thread(target=slow_upload)
    upload.start()
    slowest = 0.0
    while upload.is_alive():
        started = time.perf_counter()
        assert httpx.get(f"{base_url}/health/live", timeout=5).status_code == 200
        slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.02)
    upload.join()
    assert refused == [413]
    assert slowest < 1.0, f"/health/live took {slowest:.3f}s during the upload"


def test_ten_thousand_bad_events_answer_about_60_kb_with_the_default_settings(
    kafka_bootstrap, redis_url, make_topic, unique
):
    # docs/serving.md's figure: the default 100 refusals described in full (six wrong fields
    # each here, ~600 bytes), the other 9,900 counted; the size does not grow with the batch.
    topic = make_topic(partitions=2, prefix="orders")
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=f"test-{unique}"),
        serve=HttpSettings(auth="off"),
    )
    context = ServiceContext(
        settings, redis_client(redis_url), [dataclasses.replace(ORDERS, name=topic)]
    )
    sizes = []
    try:
        with served(create_app(settings, context=context)) as url:
            for count in (1_000, 10_000):
                answer = httpx.post(
                    f"{url}/v1/events",
                    content=_bad_events(count),
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                )
                assert answer.status_code == 422
                assert answer.json()["error"]["errors_omitted"] == count - 100
                sizes.append(len(answer.content))
    finally:
        context.close()
    assert 50_000 < sizes[1] < 70_000, sizes
    assert abs(sizes[1] - sizes[0]) < 100, sizes
