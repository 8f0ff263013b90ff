"""Auto-pipelined entity reads on the real redis-server: concurrent reads share a round trip,
each gets its own answer, a flip is followed, and a Redis that fails fails every waiting read;
the hot path (answered before FastAPI) refuses as the declared route does."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.autopipeline import AutoPipeline
from refold.contracts.store.connect import async_redis_client, redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.local_stack import free_port
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldWriter
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.auth import ApiKeyStore
from refold.services.reader.state_reader import StateReader
from tests.integration.test_fold_writer import records_for

pytestmark = pytest.mark.integration

P = OrderStateProjection()


def _counting_round_trips(client: Any) -> list[int]:
    """Count the connections ``client``'s pool lends (each batch's round trip takes one)."""
    made: list[int] = []
    pool = client.connection_pool
    lend = pool.get_connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return await lend(*args, **kwargs)

    pool.get_connection = counted
    return made


def test_concurrent_reads_share_one_round_trip_and_each_gets_its_own_answer(target, redis_url):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    first = registry.create({}, live=True)
    events = list(OrderSimulator(60, seed=8, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    states = fold_all(P, events).states
    keys = [*sorted(states), "nope-1", "nope-2"]
    reader = StateReader(client, "order_state", target.key_prefix)
    for _ in range(2):  # the first resolves the alias, the second loads the script
        assert reader.get("orders", keys[0]).value == states[keys[0]]

    async def reads() -> tuple[list[Any], list[int], Any]:
        aclient = async_redis_client(redis_url)
        made = _counting_round_trips(aclient)
        pipeline = AutoPipeline(aclient, 2.0)
        try:
            views = await asyncio.gather(*(reader.get_async(pipeline, "orders", k) for k in keys))
            # A command Redis refuses fails alone; the others of its batch are answered.
            mixed = await asyncio.gather(
                pipeline.execute_command("HGETALL", registry.keys(first).table("orders", keys[0])),
                reader.get_async(pipeline, "orders", keys[1]),
                return_exceptions=True,
            )
            return views, made, mixed
        finally:
            await aclient.aclose()

    views, made, mixed = asyncio.run(reads())
    assert made == [1, 1]  # every read of the gather in one round trip, then the mixed batch
    positions = registry.positions(first)[0]
    assert positions != {}
    for key, view in zip(keys, views, strict=True):
        assert (view.generation, view.value, view.positions) == (
            first,
            states.get(key),
            positions,
        )
    assert isinstance(mixed[0], redis.exceptions.ResponseError)  # WRONGTYPE: a string
    assert mixed[1].value == states[keys[1]]


def test_pipelined_reads_follow_a_flip_and_a_flushed_script_without_mixing_generations(
    target, redis_url
):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    first = registry.create({}, live=True)
    events = list(OrderSimulator(30, seed=9, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    second = registry.create({})
    # Generation 2 folds only the first half of the log: other states, other positions.
    half = events[: len(events) // 2]
    FoldWriter(dataclasses.replace(target, generation=second), P).apply(records_for(half))
    states = {first: fold_all(P, events).states, second: fold_all(P, half).states}
    positions = {g: registry.positions(g)[0] for g in (first, second)}
    assert positions[first] != positions[second]
    keys = sorted(states[first])
    reader = StateReader(client, "order_state", target.key_prefix)
    reader.get("orders", keys[0])  # resolves the alias

    async def reads() -> list[list[Any]]:
        aclient = async_redis_client(redis_url)
        pipeline = AutoPipeline(aclient, 2.0)
        batches = []
        try:
            for step in ("first", "flip", "flushed", "back"):
                tasks = [
                    asyncio.ensure_future(reader.get_async(pipeline, "orders", k)) for k in keys
                ]
                # Queued, not yet sent: a flip now is seen by every read of the batch.
                if step == "flip":
                    registry.flip(second)
                if step == "flushed":
                    client.script_flush()  # each read loads the script again
                if step == "back":
                    registry.flip(first, record_replaced=False)
                batches.append(await asyncio.gather(*tasks))
            return batches
        finally:
            await aclient.aclose()

    for batch, generation in zip(asyncio.run(reads()), (first, second, second, first), strict=True):
        for key, view in zip(keys, batch, strict=True):
            assert view.generation == generation
            assert view.value == states[generation].get(key)
            assert view.positions == positions[generation]


@contextlib.asynccontextmanager
async def _silent_redis() -> AsyncIterator[str]:
    """A server that accepts connections and never answers: a Redis that hangs."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.close()
        for writer in held:
            writer.close()


def test_a_redis_that_fails_fails_every_waiting_read_and_the_next_batch_recovers(redis_url):
    closed = free_port()  # nothing listens there
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", closed)) != 0

    async def run() -> tuple[list[Any], list[Any], Any]:
        down = async_redis_client(f"redis://127.0.0.1:{closed}/0", socket_timeout=None)
        refused = await asyncio.gather(*_batch(AutoPipeline(down, 2.0), 6), return_exceptions=True)
        await down.aclose()
        async with _silent_redis() as url:
            hung = async_redis_client(url, socket_timeout=None)
            pipeline = AutoPipeline(hung, 0.3)
            timed_out = await asyncio.gather(*_batch(pipeline, 5), return_exceptions=True)
            await hung.aclose()
        up = async_redis_client(redis_url, socket_timeout=None)
        answered = await asyncio.gather(*_batch(AutoPipeline(up, 2.0), 3))
        await up.aclose()
        return refused, timed_out, answered

    refused, timed_out, answered = asyncio.run(run())
    assert len(refused) == 6
    assert all(isinstance(e, redis.exceptions.ConnectionError) for e in refused)
    assert len(timed_out) == 5
    assert all(isinstance(e, redis.exceptions.TimeoutError) for e in timed_out)
    assert answered == [True] * 3  # redis-py parses PONG as True


def _batch(pipeline: AutoPipeline, n: int) -> list[Any]:
    return [pipeline.execute_command("PING") for _ in range(n)]


def test_every_read_waiting_on_a_redis_that_hangs_answers_503(target, redis_url):
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    registry.create({}, live=True)
    events = list(OrderSimulator(10, seed=4, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    key = sorted(fold_all(P, events).states)[0]
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        redis=RedisSettings(url=redis_url, key_prefix=target.key_prefix),
        serve=HttpSettings(auth="off"),
    )

    async def run() -> tuple[httpx.Response, list[httpx.Response]]:
        async with _silent_redis() as url:
            # Blocking reads on the real Redis; the asyncio client's round trips hang.
            context = ServiceContext(settings, client, redis_url=url)
            app = create_app(settings, context=context)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                path = f"/v1/processors/order_state/tables/orders/entities/{key}"
                first = await http.get(path)  # resolves the alias, blocking: answered
                waiting = await asyncio.gather(*(http.get(path) for _ in range(6)))
            await context.close_async_redis()
            return first, waiting

    first, waiting = asyncio.run(run())
    assert first.status_code == 200
    assert len(waiting) == 6
    for answer in waiting:
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "REDIS_UNAVAILABLE"
        assert answer.headers["Retry-After"] == "1"


@dataclasses.dataclass(frozen=True)
class _Served:
    """An app over a folded order_state generation, with an API key allowed to query."""

    app: Any
    path: str  # of an order that exists
    headers: dict[str, str]


def _served(target: Any, redis_url: str, seed: int, serve: HttpSettings) -> _Served:
    client = redis_client(redis_url)
    GenerationRegistry.of(client, "order_state", target.key_prefix).create({}, live=True)
    events = list(OrderSimulator(5, seed=seed, anomaly_rate=0))
    FoldWriter(target, P).apply(records_for(events))
    key = sorted(fold_all(P, events).states)[0]
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        redis=RedisSettings(url=redis_url, key_prefix=target.key_prefix),
        serve=serve,
    )
    api_key = ApiKeyStore(client, target.key_prefix).add("reader", ["query"])
    context = ServiceContext(settings, client, redis_url=redis_url)
    return _Served(
        create_app(settings, context=context),
        f"/v1/processors/order_state/tables/orders/entities/{key}",
        {"Authorization": f"Bearer {api_key}"},
    )


def test_the_hot_path_leaves_a_body_to_the_limit_and_answers_429_as_the_route_does(
    target, redis_url
):
    limits = HttpSettings(auth="keys", max_request_bytes=1024, query_rate_limit="3/minute")
    served = _served(target, redis_url, 6, limits)
    path, headers = served.path, served.headers
    with TestClient(served.app) as http:
        # The first read looks the key up (the declared route); the next two are plain reads
        # of a key this process has verified (the hot path), each counted.
        assert [http.get(path, headers=headers).status_code for _ in range(3)] == [200] * 3
        refused = http.get(path, headers=headers)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "RATE_LIMITED"
        assert int(refused.headers["Retry-After"]) >= 1
        # A GET with a body goes through the app as declared: the body limit answers it.
        big = http.request("GET", path, headers=headers, content=b"x" * 2048)
        assert big.status_code == 413
        assert big.json()["error"]["code"] == "REQUEST_TOO_LARGE"


def test_middleware_a_user_adds_runs_for_every_read_the_hot_path_included(target, redis_url):
    served = _served(target, redis_url, 7, HttpSettings(auth="keys"))
    seen: list[str] = []

    @served.app.middleware("http")
    async def audit(request: Any, call_next: Any) -> Any:
        seen.append(request.url.path)
        response = await call_next(request)
        response.headers["X-Audited"] = "yes"
        return response

    with TestClient(served.app) as http:
        # The first read verifies the key; the next two would be the hot path's.
        answers = [http.get(served.path, headers=served.headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert [a.headers.get("X-Audited") for a in answers] == ["yes"] * 3
    assert seen == [served.path] * 3
