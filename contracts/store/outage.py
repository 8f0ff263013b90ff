"""Waiting out an unreachable Redis: one rule for every writer and reader of refold.

A Redis restart, a failover or a network cut is an outage: the caller waits, with exponential
backoff, up to a patience of its own, logging when the outage starts and when it ends, and then
gives up with its own error (nothing was written meanwhile, so nothing is lost). A refused login
is not an outage: ``redis.AuthenticationError`` is a ``ConnectionError``, and retrying a wrong
password for minutes hid the one line the operator needs (:mod:`.credentials`). So every wait
checks that first.

Hand-written rather than tenacity's ``Retrying``: the fold envelope retries an outage inside a
loop that also refills holes between attempts, the DataFrame sink inside one that also retries
WATCH conflicts, and both need the refusal check before any wait. A small class they call from
their own ``except`` fits all three; a decorator fits none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from refold.contracts.store.credentials import raise_if_refused

__all__ = ["REDIS_UNAVAILABLE", "RedisOutage", "wait_out_redis"]

logger = logging.getLogger(__name__)

# Redis errors that mean "not reachable right now" (a restart, a failover, a network cut): the
# caller waits and retries. A replica answering READONLY is a failover in progress; so is a
# Redis Cluster answering CLUSTERDOWN / TRYAGAIN, or a slot no node serves for a moment.
REDIS_UNAVAILABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)

_T = TypeVar("_T")


class RedisOutage:
    """One outage, from the first failed call: backoff, a bound, a line at each end.

    Args:
        who: Who waits, for the refused-login error (``"the processor order_state"``).
        client: The client whose login a refusal names.
        give_up: The error to raise after ``patience_s``, from the seconds waited and the last
            Redis error (it says what was not done and what the operator should do).
        patience_s: How long to wait before giving up; ``None``: no bound (a lease's renewer,
            which has nothing to give up to).
        first_delay_s: The first wait; each next one doubles, up to ``max_delay_s``.
        max_delay_s: The longest single wait.
        log_extra: ``extra`` of the log lines (generation, processor...).
        sleep: How to wait (default ``time.sleep``; ``threading.Event.wait`` lets a stop cut
            a wait short).
    """

    def __init__(
        self,
        who: str,
        client: redis.Redis,
        give_up: Callable[[float, Exception], Exception],
        *,
        patience_s: float | None = 600.0,
        first_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
        log_extra: dict[str, object] | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.who = who
        self.client = client
        self.give_up = give_up
        self.patience_s = patience_s
        self.max_delay_s = max_delay_s
        self.log_extra = log_extra or {}
        self.started = time.monotonic()
        self.delay = first_delay_s
        self.waits = 0
        self._sleep = sleep

    def wait(self, exc: Exception) -> None:
        """After a failed call: raise if it was a refusal or patience ran out, else sleep.

        Raises:
            RedisCredentialsError: Redis refused the login (not an outage).
            Exception: ``give_up``'s error, after ``patience_s``.
        """
        raise_if_refused(exc, self.who, self.client)
        waited = time.monotonic() - self.started
        if self.patience_s is not None and waited > self.patience_s:
            raise self.give_up(waited, exc) from exc
        if not self.waits:
            bound = "for it" if self.patience_s is None else f"up to {self.patience_s:.0f}s"
            logger.warning(
                "Redis unreachable (%s); %s waits %s", exc, self.who, bound, extra=self.log_extra
            )
        self.waits += 1
        (self._sleep or time.sleep)(self.delay)
        self.delay = min(self.delay * 2, self.max_delay_s)

    def over(self) -> None:
        """After the first call that worked again: say how long it lasted and how many failed."""
        logger.warning(
            "Redis reachable again after %.1fs (%d failed call%s); %s carries on",
            time.monotonic() - self.started,
            self.waits,
            "" if self.waits == 1 else "s",
            self.who,
            extra=self.log_extra,
        )


def wait_out_redis(
    call: Callable[[], _T],
    who: str,
    client: redis.Redis,
    give_up: Callable[[float, Exception], Exception],
    *,
    patience_s: float = 600.0,
    first_delay_s: float = 0.2,
) -> _T:
    """Run ``call``; while Redis is unreachable, wait (see :class:`RedisOutage`) and again.

    Args:
        call: The Redis work; it must be safe to run again (a transaction, a read).
        who: Who waits, for messages.
        client: The client ``call`` uses.
        give_up: The error after patience runs out.
        patience_s: How long to wait before giving up.
        first_delay_s: The first wait (then doubling, up to 5 s).
    """
    outage: RedisOutage | None = None
    while True:
        try:
            result = call()
        except REDIS_UNAVAILABLE as exc:
            outage = outage or RedisOutage(
                who, client, give_up, patience_s=patience_s, first_delay_s=first_delay_s
            )
            outage.wait(exc)
        else:
            if outage is not None:
                outage.over()
            return result
