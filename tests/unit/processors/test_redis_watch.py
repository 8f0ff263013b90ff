"""The processor driver's Redis outage lines: the real duration, and a stall never unsaid."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from refold.processors.runtime import query_loop


class _Registry:
    """Answers ``status`` as scripted: (seconds the call hangs, then its answer or error)."""

    def __init__(self, script: list[tuple[float, object]]) -> None:
        self.script = script

    def status(self, generation: int) -> object:
        hang, answer = self.script.pop(0)
        time.sleep(hang)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _check(watch: query_loop._RedisWatch) -> None:
    try:
        watch.check(None, following=False)  # type: ignore[arg-type]
    except query_loop.REDIS_UNAVAILABLE as exc:
        watch.unreachable(exc)


def test_the_outage_lasts_from_the_first_failed_call_s_start(caplog) -> None:
    # The first call hangs until its timeout: the outage began when it was made, not when it
    # failed (a 6 s stall was logged as "after 1.0s").
    watch = query_loop._RedisWatch(
        _Registry([(0.6, redis.TimeoutError("timed out")), (0.0, "live")]), 1, False
    )
    with caplog.at_level(logging.WARNING, logger=query_loop.__name__):
        _check(watch)
        _check(watch)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    seconds = float(lines[1].split("after ")[1].split("s")[0])
    assert seconds == pytest.approx(0.6, abs=0.15)


def test_a_call_that_hangs_and_then_answers_is_an_outage_logged_once(caplog, monkeypatch) -> None:
    monkeypatch.setattr(query_loop._RedisWatch, "_STALL_S", 0.3)
    watch = query_loop._RedisWatch(_Registry([(0.5, "live"), (0.0, "live")]), 1, False)
    with caplog.at_level(logging.WARNING, logger=query_loop.__name__):
        _check(watch)
        _check(watch)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "Redis answered after 0.5s" in lines[0]
