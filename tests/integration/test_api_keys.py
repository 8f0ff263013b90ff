"""API keys on a real redis-server: scopes enforced, 401/403 bodies, revocation without restart,
and ``refold keys add | list | revoke``."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from refold.contracts.kafka.admin import delete_topics
from refold.contracts.service_keys import ApiKeyKeys
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import async_redis_client, redis_client
from refold.deploy.keys_cli import main as keys_main
from refold.deploy.local_stack import free_port
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.api.errors import install_error_handlers
from refold.services.api.rate_limits import LoopShares, RateLimits
from refold.services.auth import ApiKeyStore, require
from refold.services.auth.dependencies import VERIFY_CACHE_S
from refold.services.auth.errors import ApiKeyNameTakenError, UnknownApiKeyError
from tests.support.waiting import assert_eventually


@pytest.fixture
def prefix(unique) -> str:
    return f"test-{unique}"


@pytest.fixture
def client(redis_url, prefix):
    connection = redis_client(redis_url)
    yield connection
    connection.delete(ApiKeyKeys(prefix).registry)
    connection.close()


@pytest.fixture
def store(client, prefix) -> ApiKeyStore:
    return ApiKeyStore(client, prefix)


def _app(
    redis_url: str,
    prefix: str,
    auth: str = "keys",
    kafka: str | None = None,
    on_loop: bool = False,
    **serve: str,
) -> TestClient:
    """An app with one route per scope; ``on_loop``: its context has an asyncio client, so
    shares of rate limits are taken on the event loop (LoopShares), not on a thread."""
    settings = ServeSettings(
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth=auth, **serve),
        **({"kafka": KafkaSettings(bootstrap_servers=kafka)} if kafka else {}),
    )
    app = FastAPI()
    install_error_handlers(app)
    app.state.context = ServiceContext(
        settings, redis_client(redis_url), redis_url=redis_url if on_loop else None
    )
    for scope in ("ingest", "query", "admin"):
        app.add_api_route(f"/{scope}", _answer(scope), dependencies=[Depends(require(scope))])
    return TestClient(app)


def _answer(scope: str):
    def route() -> dict[str, str]:
        return {"ok": scope}

    return route


@pytest.fixture
def api(redis_url, prefix) -> TestClient:
    return _app(redis_url, prefix)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ON_LOOP = pytest.mark.parametrize("on_loop", [False, True], ids=["on a thread", "on the loop"])


@ON_LOOP
def test_a_key_over_its_rate_limit_gets_429_with_retry_after_and_other_keys_go_on(
    store, redis_url, prefix, on_loop
):
    api = _app(
        redis_url, prefix, ingest_rate_limit="3/minute", query_rate_limit="", on_loop=on_loop
    )
    busy, other = store.add("busy", ["ingest", "query"]), store.add("other", ["ingest"])
    answers = [api.get("/ingest", headers=_bearer(busy)).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    refused = api.get("/ingest", headers=_bearer(busy))
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "RATE_LIMITED"
    assert error["limit"] == "3 per 1 minute"
    assert "REFOLD_SERVE__INGEST_RATE_LIMIT" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert api.get("/ingest", headers=_bearer(other)).status_code == 200  # its own count
    assert api.get("/query", headers=_bearer(busy)).status_code == 200  # no query limit set
    assert api.get("/admin", headers=_bearer(store.add("ops", ["admin"]))).status_code == 200
    # The counts live in Redis, under the service's prefix: every worker shares them.
    assert any(
        store_key.startswith(f"{prefix}:ratelimit".encode())
        for store_key in redis_client(redis_url).scan_iter(match=f"{prefix}:ratelimit*")
    )


@ON_LOOP
def test_a_large_limit_is_taken_in_shares_and_holds_across_processes(
    store, redis_url, prefix, on_loop
):
    # Two apps stand for two worker processes sharing one count. 200/minute: shares of 2.
    apps = [
        _app(redis_url, prefix, query_rate_limit="200/minute", on_loop=on_loop) for _ in range(2)
    ]
    busy = store.add("busy", ["query"])
    assert apps[0].get("/query", headers=_bearer(busy)).status_code == 200
    (count_key,) = redis_client(redis_url).scan_iter(match=f"{prefix}:ratelimit*")
    assert int(redis_client(redis_url).get(count_key)) == 2  # a share: one round trip for two
    answers = [apps[i % 2].get("/query", headers=_bearer(busy)).status_code for i in range(250)]
    admitted = 1 + answers.count(200)
    # At most the limit; at least the limit less a share per process (taken, not spent). One
    # process may still spend its share after the other was refused.
    assert 200 - 2 * 2 <= admitted <= 200
    assert answers[-40:] == [429] * 40


def test_requests_that_find_their_share_spent_at_once_take_one_share(client, prefix):
    # A worker holds several requests of a key: those that find its share spent together
    # take one share between them, not one each (all but the last would be lost).
    limits = RateLimits(client, prefix, {"query": "1000/minute"})  # shares of 10
    start = threading.Barrier(8)

    def request() -> None:
        start.wait()
        limits.check("query", "k1")

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (count_key,) = client.scan_iter(match=f"{prefix}:ratelimit*")
    assert int(client.get(count_key)) == 10
    for _ in range(2):  # the share's last two, from memory
        limits.check("query", "k1")
    assert int(client.get(count_key)) == 10
    limits.check("query", "k1")
    assert int(client.get(count_key)) == 20


def test_requests_of_one_loop_that_find_their_share_spent_take_one_share_in_the_same_count(
    client, redis_url, prefix
):
    limits = RateLimits(client, prefix, {"query": "1000/minute"})  # shares of 10

    async def eight_at_once() -> list[bool]:
        loop_client = async_redis_client(redis_url)
        try:
            shares = LoopShares(limits, loop_client, timeout_s=2.0)
            return list(await asyncio.gather(*(shares.admit("query", "k1") for _ in range(8))))
        finally:
            await loop_client.aclose()

    assert asyncio.run(eight_at_once()) == [True] * 8
    (count_key,) = client.scan_iter(match=f"{prefix}:ratelimit*")
    assert int(client.get(count_key)) == 10  # one share for the eight
    for _ in range(2):  # the share's last two, from memory, on the blocking path
        limits.check("query", "k1")
    assert int(client.get(count_key)) == 10
    limits.check("query", "k1")  # the blocking path's next share, in the same count
    assert int(client.get(count_key)) == 20


def test_a_limit_counted_a_request_at_a_time_is_left_to_the_blocking_count(
    client, redis_url, prefix
):
    limits = RateLimits(client, prefix, {"ingest": "5/minute"})

    async def admit() -> bool:
        loop_client = async_redis_client(redis_url)
        try:
            return await LoopShares(limits, loop_client, timeout_s=2.0).admit("ingest", "k1")
        finally:
            await loop_client.aclose()

    assert not asyncio.run(admit())
    assert list(client.scan_iter(match=f"{prefix}:ratelimit*")) == []  # not counted here


@pytest.mark.parametrize("redis_is", ["not there", "hung"])
def test_requests_that_await_a_share_redis_fails_to_give_go_on_after_one_wait(
    client, prefix, redis_is, caplog
):
    """No second wait on a thread (count_one) for a Redis that just failed: as the blocking
    path, an unreachable Redis lets requests through, warned once per share not taken."""
    limits = RateLimits(client, prefix, {"query": "1000/minute"})
    # Hung: a socket that takes connections (the kernel's backlog) and never answers.
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)
    port = silent.getsockname()[1] if redis_is == "hung" else free_port()

    async def eight_at_once() -> list[bool]:
        loop_client = async_redis_client(f"redis://127.0.0.1:{port}/0")
        try:
            shares = LoopShares(limits, loop_client, timeout_s=0.5)
            return list(await asyncio.gather(*(shares.admit("query", "k1") for _ in range(8))))
        finally:
            await loop_client.aclose()

    started = time.monotonic()
    with silent, caplog.at_level("WARNING", logger="refold.services.api.rate_limits"):
        assert asyncio.run(eight_at_once()) == [True] * 8
    assert time.monotonic() - started < 1.5  # one wait of 0.5 s at most, shared by the eight
    warnings = [r.getMessage() for r in caplog.records if "not counted" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert list(client.scan_iter(match=f"{prefix}:ratelimit*")) == []


def test_store_round_trip(store, client, prefix):
    key = store.add("checkout", ["query", "ingest"], expires_in_s=3600)
    assert key.startswith("rfk_")
    found = store.verify(key)
    assert found is not None
    assert (found.name, found.scopes) == ("checkout", ("ingest", "query"))
    assert found.expires_at == found.created_at + 3_600_000
    # Redis holds no key, only its SHA-256.
    raw = client.hgetall(ApiKeyKeys(prefix).registry)
    assert list(raw) == [found.id.encode()]
    assert key.encode() not in raw[found.id.encode()]
    assert key.split("_", 2)[2].encode() not in raw[found.id.encode()]
    # A right id with a wrong secret is no key.
    assert store.verify(key[:-2] + ("AA" if not key.endswith("AA") else "BB")) is None
    assert [k.id for k in store.list()] == [found.id]
    assert store.get("checkout") == found


def test_names_are_unique_among_unrevoked_keys(store):
    first = store.add("ci", ["ingest"])
    with pytest.raises(ApiKeyNameTakenError, match="revoke it first"):
        store.add("ci", ["query"])
    revoked = store.revoke("ci")
    assert revoked.revoked_at is not None
    second = store.add("ci", ["query"])  # the name is free again
    assert store.get("ci").id == second.split("_")[1]
    assert store.verify(first) is None
    assert store.lookup(first).status(store.now_ms()) == "revoked"
    assert [k.name for k in store.list()] == ["ci"]
    assert len(store.list(include_revoked=True)) == 2
    # Revoking again changes nothing; by id or by the whole key.
    assert store.revoke(first) == revoked
    with pytest.raises(UnknownApiKeyError, match="keys not revoked: ci"):
        store.revoke("nobody")


def test_expiry_is_exact(client, prefix):
    now = [1_000.0]
    store = ApiKeyStore(client, prefix, cache_s=60, clock=lambda: now[0])
    key = store.add("short", ["query"], expires_in_s=10)
    assert store.verify(key) is not None
    now[0] += 10
    assert store.verify(key) is None  # even from the cache
    assert store.lookup(key).status(store.now_ms()) == "expired"


def test_scopes_are_enforced(api, store):
    query = store.add("dash", ["query"])
    ingest = store.add("producer", ["ingest"])
    admin = store.add("ops", ["admin"])
    assert api.get("/query", headers=_bearer(query)).json() == {"ok": "query"}
    assert api.get("/ingest", headers={"X-API-Key": ingest}).status_code == 200
    for route in ("/ingest", "/query", "/admin"):
        assert api.get(route, headers=_bearer(admin)).json() == {"ok": route[1:]}
    response = api.get("/ingest", headers=_bearer(query))
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "FORBIDDEN"
    assert error["message"] == (
        f"this key (name 'dash', id {query.split('_')[1]}) has scopes [query]; "
        "this route needs ingest"
    )
    assert (error["required_scope"], error["scopes"]) == ("ingest", ["query"])
    assert 'error="insufficient_scope"' in response.headers["WWW-Authenticate"]
    assert api.get("/admin", headers=_bearer(ingest)).status_code == 403


def test_401_bodies(api, store):
    response = api.get("/query")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="refold"'
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    assert "no API key" in response.json()["error"]["message"]

    key = store.add("dash", ["query"])
    wrong = key[:-4] + ("abcd" if not key.endswith("abcd") else "wxyz")
    response = api.get("/query", headers=_bearer(wrong))
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["message"].startswith("unknown API key")
    assert "mistyped" in response.json()["error"]["message"]


def test_a_401_after_the_key_store_was_emptied_says_so(api, store, client, prefix, kafka_bootstrap):
    # A Redis that restarted empty lost every key not journaled (this one was made without the
    # CLI): "mistyped" would send people the wrong way.
    key = store.add("dash", ["query"])
    assert api.get("/query", headers=_bearer(key)).status_code == 200
    client.delete(ApiKeyKeys(prefix).registry)
    fresh = _app(api.app.state.context.settings.redis.url, prefix, kafka=kafka_bootstrap)
    response = fresh.get("/query", headers=_bearer(key))
    assert response.status_code == 401
    message = response.json()["error"]["message"]
    assert "holds no keys at all" in message
    assert "refold keys add" in message


def test_revocation_is_seen_without_a_restart(api, store, redis_url, prefix):
    key = store.add("dash", ["query"])
    assert api.get("/query", headers=_bearer(key)).status_code == 200
    # Revoked by another process (another store, as `refold keys revoke` is).
    ApiKeyStore(redis_client(redis_url), prefix).revoke("dash")
    started = time.monotonic()
    response = assert_eventually(
        lambda: (r := api.get("/query", headers=_bearer(key))).status_code == 401 and r,
        timeout=VERIFY_CACHE_S + 5,
        interval=0.05,
        message="the revoked key was still accepted",
    )
    assert time.monotonic() - started < VERIFY_CACHE_S + 1
    error = response.json()["error"]
    assert error["code"] == "UNAUTHENTICATED"
    assert "was revoked at" in error["message"]
    assert "'dash'" in error["message"]
    # A key added meanwhile works at once (nothing negative is cached).
    assert api.get("/query", headers=_bearer(store.add("dash", ["query"]))).status_code == 200


def test_auth_off_lets_everything_through(redis_url, prefix):
    api = _app(redis_url, prefix, auth="off")
    for route in ("/ingest", "/query", "/admin"):
        assert api.get(route).status_code == 200


def test_redis_down_is_a_503(prefix):
    api = _app("redis://127.0.0.1:1/0", prefix)
    response = api.get("/query", headers=_bearer("rfk_0123456789abcdef_secret"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "AUTH_UNAVAILABLE"


@pytest.fixture
def journal(kafka_bootstrap, prefix, monkeypatch):
    """The keys' journal topic of this test's prefix, deleted afterwards."""
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    yield f"{prefix}.api-keys"
    delete_topics({"bootstrap.servers": kafka_bootstrap}, [f"{prefix}.api-keys"])


def test_keys_made_by_the_cli_come_back_after_redis_lost_them(
    monkeypatch, capsys, redis_url, prefix, client, kafka_bootstrap, journal
):
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", prefix)
    assert keys_main(["add", "--name", "kept", "--scope", "query", "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)["key"]
    assert keys_main(["add", "--name", "gone", "--scope", "query", "--json"]) == 0
    gone = json.loads(capsys.readouterr().out)
    assert keys_main(["revoke", gone["id"]]) == 0
    capsys.readouterr()

    client.delete(ApiKeyKeys(prefix).registry)  # Redis restarted empty
    app = _app(redis_url, prefix, kafka=kafka_bootstrap)
    assert app.get("/query", headers=_bearer(kept)).status_code == 200  # restored on demand
    refused = app.get("/query", headers=_bearer(gone["key"]))
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]["message"]  # the revocation came back too

    client.delete(ApiKeyKeys(prefix).registry)
    assert keys_main(["list", "--json", "--all"]) == 0  # every keys command restores first
    rows = json.loads(capsys.readouterr().out)
    assert {(r["name"], r["status"]) for r in rows} == {("kept", "active"), ("gone", "revoked")}


def test_cli_add_list_revoke(monkeypatch, capsys, redis_url, prefix, client, api, journal):
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", prefix)
    assert keys_main(["add", "--name", "svc", "--scope", "ingest", "--scope", "query"]) == 0
    out = capsys.readouterr().out
    key = next(line.strip() for line in out.splitlines() if line.strip().startswith("rfk_"))
    assert "shown only now" in out
    assert api.get("/ingest", headers=_bearer(key)).status_code == 200

    assert keys_main(["add", "--name", "ops", "--scope", "admin", "--expires-in-days", "1"]) == 0
    capsys.readouterr()
    assert keys_main(["add", "--name", "json", "--scope", "query", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["key"].startswith(f"rfk_{added['id']}_")
    assert (added["scopes"], added["status"]) == (["query"], "active")

    assert keys_main(["list"]) == 0
    listing = capsys.readouterr().out
    assert key not in listing
    for word in ("svc", "ops", "json", "ingest,query", "admin", "active"):
        assert word in listing
    assert keys_main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["svc", "ops", "json"]
    assert all("key" not in r and "sha256" not in r for r in rows)
    assert rows[1]["expires_at"] == rows[1]["created_at"] + 86_400_000

    assert keys_main(["revoke", "svc"]) == 0
    assert "revoked key" in capsys.readouterr().out
    assert keys_main(["revoke", added["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "revoked"
    assert keys_main(["list", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["ops"]
    assert keys_main(["list", "--all"]) == 0
    assert capsys.readouterr().out.count("revoked") == 2

    assert keys_main(["revoke", "nobody"]) == 1
    assert "API_KEY_UNKNOWN" in capsys.readouterr().err
    assert keys_main(["add", "--name", "ops", "--scope", "query"]) == 1
    assert "API_KEY_NAME_TAKEN" in capsys.readouterr().err
    assert_eventually(
        lambda: api.get("/ingest", headers=_bearer(key)).status_code == 401,
        timeout=VERIFY_CACHE_S + 5,
        interval=0.05,
    )
