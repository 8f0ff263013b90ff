"""bench/peers/latency: how ``make bench-peers`` times an engine's state (real redis-server)."""

import time

import pytest

from bench.peers.latency import FirstWrites
from refold.contracts.store.connect import redis_client

pytestmark = pytest.mark.integration


def _wait_for(watch, keys):
    deadline = time.monotonic() + 10
    while not set(keys) <= set(watch.first):
        assert time.monotonic() < deadline, f"seen {sorted(watch.first)}, waiting for {keys}"
        time.sleep(0.01)


def test_each_matching_key_is_timed_at_its_first_set_or_mset_only(redis_url, unique):
    client = redis_client(redis_url)
    before = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    watch = FirstWrites(client, f"{unique}:*")
    try:
        client.set(f"{unique}:a", b"1")
        client.mset({f"{unique}:b": b"1", f"{unique}:c": b"1"})  # as refold's writer does
        client.set(f"other-{unique}:d", b"1")  # another engine's key: not watched
        _wait_for(watch, {"a", "b", "c"})
        first_a = watch.first["a"]
        time.sleep(0.05)
        client.set(f"{unique}:a", b"2")  # a later state of the same order
        client.set(f"{unique}:e", b"1")
        _wait_for(watch, {"e"})
    finally:
        watch.close()
    assert set(watch.first) == {"a", "b", "c", "e"}
    assert watch.first["a"] == first_a
    assert first_a <= watch.first["b"] == pytest.approx(watch.first["c"], abs=0.05)
    assert watch.first["e"] - first_a >= 0.05
    assert client.config_get("notify-keyspace-events")["notify-keyspace-events"] == before
