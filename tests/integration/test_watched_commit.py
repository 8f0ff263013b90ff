"""The optimistic commit every engine writes through, against a real redis-server."""

from __future__ import annotations

import pytest

from refold.contracts.store.connect import redis_client
from refold.processors.errors import SinkConflictError
from refold.processors.runtime.watched_commit import WATCH_ATTEMPTS, commit_watched


def test_a_conflict_reads_again_and_commits_once(redis_url, unique):
    client = redis_client(redis_url)
    guard, total = f"{unique}:guard", f"{unique}:total"
    client.set(guard, 0)
    tries = []

    def attempt(pipe):
        seen = int(pipe.get(guard))
        tries.append(seen)
        if len(tries) == 1:
            client.set(guard, 5)  # another writer moves the guard between WATCH and EXEC
        pipe.multi()
        pipe.incrby(total, seen + 1)
        pipe.set(guard, seen + 1)
        pipe.execute()
        return seen

    assert commit_watched(client, [guard], attempt, "test g1") == 5
    assert tries == [0, 5]  # the second attempt read what the other writer wrote
    assert int(client.get(total)) == 6  # only the second attempt's write happened
    assert int(client.get(guard)) == 6


def test_nothing_to_write_returns_without_exec(redis_url, unique):
    client = redis_client(redis_url)
    guard = f"{unique}:guard"
    client.set(guard, 7)
    assert commit_watched(client, [guard], lambda pipe: int(pipe.get(guard)), "test g1") == 7


def test_keys_that_keep_changing_are_refused_as_another_writer(redis_url, unique):
    client = redis_client(redis_url)
    guard, total = f"{unique}:guard", f"{unique}:total"
    tries = []

    def attempt(pipe):
        tries.append(1)
        client.incr(guard)  # a second process writes this generation, every time
        pipe.multi()
        pipe.incr(total)
        pipe.execute()

    with pytest.raises(SinkConflictError, match="another process writes this generation"):
        commit_watched(client, [guard], attempt, "order_state g3")
    assert len(tries) == WATCH_ATTEMPTS
    assert client.get(total) is None  # no attempt committed
