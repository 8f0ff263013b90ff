"""One way to wait in tests: :func:`assert_eventually`, instead of hand-rolled deadline loops."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["answer_within_budget", "assert_eventually"]

T = TypeVar("T")


def assert_eventually(
    probe: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.1,
    message: str | Callable[[], str] = "condition not met",
    alive: Callable[[], bool] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy; return that value.

    Args:
        probe: Returns a truthy value when the condition holds (an ``AssertionError`` inside
            it counts as "not yet").
        timeout: Seconds before the test fails.
        interval: Seconds between calls.
        message: What failed (a callable is evaluated only on failure, e.g. a log tail).
        alive: Fails at once when it returns False (e.g. the process under test died).
    """
    deadline = time.monotonic() + timeout
    last_error: AssertionError | None = None
    while True:
        try:
            value = probe()
        except AssertionError as exc:
            last_error, value = exc, None  # type: ignore[assignment]
        if value:
            return value
        if alive is not None and not alive():
            text = message() if callable(message) else message
            msg = f"gave up: the process under test died. {text}"
            raise AssertionError(msg) from last_error
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            msg = f"not within {timeout:.0f}s: {text}"
            raise AssertionError(msg) from last_error
        time.sleep(interval)


class _Response(Protocol):
    status_code: int
    text: str

    def json(self) -> Any: ...


def answer_within_budget(get: Callable[[], _Response], timeout: float = 30) -> Any:
    """The JSON of a route that answers 503 when the broker misses its budget, asked again.

    The lag routes give the broker 2 s; a first probe of a loaded broker (a new client's
    metadata, a topic's leaders) may miss it, and that 503 is the route's to give (test_monitor
    tests it with the broker frozen). Any other status than 200 or 503 fails at once.
    """

    def answered() -> Any:
        response = get()
        if response.status_code == 503:
            return None
        assert response.status_code == 200, response.text
        return response.json()

    return assert_eventually(answered, timeout=timeout, interval=0.5, message="kept answering 503")
