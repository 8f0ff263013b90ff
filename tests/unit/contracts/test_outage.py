"""Waiting out an unreachable Redis: backoff, a bound, and a refused login that is not an outage.

Pure logic: the calls fail as redis-py raises (no server), and sleeping is recorded, not done.
The waits against a real redis-server being restarted, paused or wrongly configured are in the
integration and fault suites.
"""

from __future__ import annotations

import pytest
import redis

from refold.contracts.store import outage as outage_module
from refold.contracts.store.credentials import RedisCredentialsError
from refold.contracts.store.outage import wait_out_redis

CLIENT = redis.Redis(host="127.0.0.1", port=1, username="reader")


class _GaveUpError(Exception):
    pass


def _give_up(waited: float, exc: Exception) -> _GaveUpError:
    return _GaveUpError(f"{waited:.0f}s {exc}")


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    naps: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(outage_module.time, "sleep", sleep)
    monkeypatch.setattr(outage_module.time, "monotonic", lambda: clock[0])
    return naps


def _failing(errors: list[Exception], result: str = "done"):
    def call() -> str:
        if errors:
            raise errors.pop(0)
        return result

    return call


def test_an_outage_is_waited_out_with_doubling_waits_and_logged_at_both_ends(slept, caplog):
    down = [redis.ConnectionError("refused"), redis.TimeoutError("slow")]
    down += [redis.exceptions.ReadOnlyError("failover")] * 5
    assert wait_out_redis(_failing(down), "the test", CLIENT, _give_up) == "done"
    assert slept == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # once when it starts, once when it is over: not once per retry
    assert "waits up to 600s" in lines[0]
    assert "reachable again after 16.2s (7 failed calls)" in lines[1]


def test_patience_ends_in_the_callers_own_error(slept):
    always = _failing([redis.ConnectionError("down")] * 100)
    with pytest.raises(_GaveUpError, match=r"^3[0-9]s down$"):
        wait_out_redis(always, "the test", CLIENT, _give_up, patience_s=30.0)
    assert sum(slept) <= 35.0


def test_a_refused_login_is_not_an_outage(slept):
    refused = _failing([redis.AuthenticationError("WRONGPASS invalid username-password pair")])
    with pytest.raises(RedisCredentialsError, match=r"refused the credentials of the test"):
        wait_out_redis(refused, "the test", CLIENT, _give_up)
    assert slept == []  # said at once, not after ten minutes of "unreachable"


def test_other_errors_are_not_waited_for(slept):
    with pytest.raises(redis.ResponseError):
        wait_out_redis(_failing([redis.ResponseError("WRONGTYPE")]), "the test", CLIENT, _give_up)
    assert slept == []
