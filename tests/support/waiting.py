"""One way to wait in tests: :func:`assert_eventually`, instead of hand-rolled deadline loops."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["assert_eventually"]

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
