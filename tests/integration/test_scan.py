"""Keys by pattern on a real redis-server: SCAN in batches, UNLINK what matches and only that."""

from __future__ import annotations

from refold.contracts.store.connect import redis_client
from refold.contracts.store.scan import SCAN_COUNT, scan_batches, scan_names, unlink_matching


def test_scan_and_unlink_take_every_matching_key_in_bounded_batches_and_nothing_else(
    redis_url, unique
):
    client = redis_client(redis_url)
    base = f"test-{unique}"
    with client.pipeline(transaction=False) as pipe:
        for i in range(2_500):
            pipe.set(f"{base}:a:{i}", i)
        for i in range(10):
            pipe.set(f"{base}:b:{i}", i)
        pipe.execute()
    batches = list(scan_batches(client, f"{base}:a:*"))
    assert all(0 < len(b) <= SCAN_COUNT for b in batches)
    assert {n for b in batches for n in b} == {f"{base}:a:{i}" for i in range(2_500)}
    odd = unlink_matching(client, f"{base}:a:*", only=lambda name: int(name.rsplit(":", 1)[1]) % 2)
    assert odd == 1_250
    assert set(scan_names(client, f"{base}:a:*")) == {f"{base}:a:{i}" for i in range(0, 2_500, 2)}
    assert unlink_matching(client, f"{base}:a:*") == 1_250
    assert not list(scan_names(client, f"{base}:a:*"))
    assert len(set(scan_names(client, f"{base}:b:*"))) == 10  # another pattern: untouched
    assert unlink_matching(client, f"{base}:*") == 10
    client.close()
