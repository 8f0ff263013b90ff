"""A lease's renewer waits out a Redis outage with one line at each end, not one per renewal.

Pure logic: the client is a fake whose ``eval`` fails as redis-py does while Redis is down;
the lease code runs unchanged (its renewal period is shortened). The renewal against a real
redis-server is in ``tests/integration/test_leases.py``.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from refold.contracts.errors import RefoldError
from refold.contracts.store import lease as lease_module
from refold.contracts.store.lease import RedisLease


class _FlakyRedis:
    """Answers like Redis, except ``eval`` fails ``down`` times in a row after the first call."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls = 0
        self.renewed = threading.Event()

    def set(self, *args: object, **kwargs: object) -> bool:
        return True

    def eval(self, *args: object) -> int:
        self.calls += 1
        if 1 < self.calls <= 1 + self.down:
            msg = "Error 111 connecting to 127.0.0.1:6379. Connection refused."
            raise redis.ConnectionError(msg)
        if self.calls > 1 + self.down:
            self.renewed.set()
        return 1


class _Lease(RedisLease):
    def _refused(self, holder: str) -> RefoldError:
        return RefoldError(holder)


def test_an_outage_while_renewing_is_one_line_when_it_starts_and_one_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lease_module, "_RENEW_S", 0.01)
    client = _FlakyRedis(down=6)
    lease = _Lease(client, "lease-key", "hooks (dispatch)")  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    lease.acquire(1.0)
    try:
        assert client.renewed.wait(10)
    finally:
        lease._stop.set()
        time.sleep(0.05)
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.exc_info for r in lines] == [None, None]  # no traceback per failed renewal
    assert "Redis unreachable" in lines[0].getMessage()
    assert "the renewal of the lease of hooks (dispatch) waits for it" in lines[0].getMessage()
    assert "reachable again after" in lines[1].getMessage()
    assert "(6 failed calls)" in lines[1].getMessage()
    assert not lease.lost.is_set()
