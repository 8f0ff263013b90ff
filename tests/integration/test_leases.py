"""The one lease mechanism (contracts/store/lease.py) under both of its users, on redis-server.

A generation's processing lease and a webhook dispatcher's lease share ``RedisLease``; each keeps
its own key, error type and message. The same scenarios run against both.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from refold.contracts.errors import RefoldError
from refold.contracts.service_keys import WebhookKeys
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.lease import GenerationLease, LeaseHeldError, RedisLease
from refold.services.webhooks.errors import WebhookLeaseError
from refold.services.webhooks.store import DispatcherLease
from tests.support.waiting import assert_eventually


@dataclass(frozen=True)
class Kind:
    """How to make one kind of lease, and what its refusal looks like."""

    make: Callable[[redis.Redis, str], RedisLease]
    error: type[RefoldError]
    message: str


def _generation_lease(client: redis.Redis, prefix: str) -> RedisLease:
    return GenerationLease(GenerationRegistry.of(client, "order_state", prefix), 3)


def _dispatcher_lease(client: redis.Redis, prefix: str) -> RedisLease:
    return DispatcherLease(client, WebhookKeys("pager", prefix), "dispatch")


KINDS = {
    "generation": Kind(_generation_lease, LeaseHeldError, "order_state g3 is being processed by"),
    "dispatcher": Kind(_dispatcher_lease, WebhookLeaseError, "webhook dispatcher pager (dispatch)"),
}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url)
    yield client
    client.close()


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


def _dead_owner() -> str:
    """An owner id of a process of this host that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return f"{socket.gethostname()}:{process.pid}:deadbeef"


def test_a_second_holder_is_refused_with_its_own_error_and_gets_it_after_release(
    client, unique, kind
):
    first, second = kind.make(client, f"test-{unique}"), kind.make(client, f"test-{unique}")
    first.acquire(0)
    try:
        assert client.get(first.key) == first.owner.encode()
        with pytest.raises(kind.error, match=re.escape(kind.message)) as refused:
            second.acquire(0.3)
        assert first.owner in str(refused.value)
        assert "15s if it died on another host" in str(refused.value)
    finally:
        first.release()
    assert client.get(first.key) is None
    second.acquire(0)
    try:
        assert client.get(second.key) == second.owner.encode()
    finally:
        second.release()


def test_the_lease_of_a_dead_process_of_this_host_is_taken_over_at_once(client, unique, kind):
    lease = kind.make(client, f"test-{unique}")
    client.set(lease.key, _dead_owner(), px=60_000)
    lease.acquire(0)
    try:
        assert client.get(lease.key) == lease.owner.encode()
        assert 0 < client.pttl(lease.key) <= 15_000
    finally:
        lease.release()


def test_a_lease_taken_by_another_owner_is_reported_lost(client, unique, kind):
    lease = kind.make(client, f"test-{unique}")
    lease.acquire(0)
    try:
        client.set(lease.key, "elsewhere:1:intruder", px=60_000)
        assert_eventually(lease.lost.is_set, timeout=10, message="lost was never set")
    finally:
        lease.release()
    assert client.get(lease.key) == b"elsewhere:1:intruder"  # releasing never drops another's


def test_the_renewer_takes_a_vanished_lease_again(client, unique, kind):
    lease = kind.make(client, f"test-{unique}")
    lease.acquire(0)
    try:
        client.delete(lease.key)  # expired while Redis was away, or a restore without it
        assert_eventually(
            lambda: client.get(lease.key) == lease.owner.encode(),
            timeout=10,
            message="the renewer did not take the expired lease again",
        )
        assert not lease.lost.is_set()
    finally:
        lease.release()


def test_releasing_on_an_unreachable_redis_raises_for_a_generation_and_is_logged_for_a_dispatcher(
    unique,
):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = redis.Redis(port=port, socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        _generation_lease(down, f"test-{unique}").release()
    _dispatcher_lease(down, f"test-{unique}").release()  # best effort: it expires by itself
