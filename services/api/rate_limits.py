"""Per-key request rates: a key over its scope's limit gets 429 ``RATE_LIMITED`` with Retry-After.

The counts are fixed windows of the ``limits`` library, kept in Redis under
``<prefix>:ratelimit``, so every worker and every host of the service shares one count per key
and scope. Limits apply to the ``ingest`` and ``query`` scopes of authenticated keys (with
``auth=off`` there is no key to count by). An unreachable Redis lets requests through: the
limiter must not turn a store outage into an ingest outage.

A large limit is not counted one request at a time: a process takes a share of it
(:data:`SHARE_DIVISOR`: 1% of the limit, e.g. 100 requests of ``10000/second``) from the shared
count in one hit and admits that many requests of the key from memory, for at most one window.
That is one Redis round trip per hundred requests instead of one each; the price is that a key
may pass its limit by up to a share per process (shares taken at the end of one window and
spent in the next), or be refused up to a share early (what other processes took and have not
spent). A limit under ``2 * SHARE_DIVISOR`` per window is counted exactly, a request at a time.

An HTTP worker takes its shares on its event loop (:class:`LoopShares`, an asyncio client of
the same Redis and the `limits` library's asyncio limiter over the same counts): taking them
on a thread, as :meth:`RateLimits.check` does for a blocking caller, cost ~35 us of CPU a
read at one share per 100 reads (the thread's handoffs, not its Redis call; measured in
process, docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Mapping

import redis
from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage as AsyncRedisStorage
from limits.aio.strategies import FixedWindowRateLimiter as AsyncFixedWindowRateLimiter
from limits.storage import RedisClusterStorage, RedisStorage
from limits.strategies import FixedWindowRateLimiter
from redis.asyncio import Redis as AsyncRedis

from refold.contracts.store.connect import is_cluster
from refold.services.api.errors import ApiError

__all__ = ["SHARE_DIVISOR", "LoopShares", "RateLimits", "parse_rate"]

logger = logging.getLogger(__name__)

# A process takes 1/SHARE_DIVISOR of a limit at a time (see the module docstring).
SHARE_DIVISOR = 100
# Keys with a share in memory at most (a stream of distinct keys refills it).
_SHARES_ENTRIES = 10_000


def _not_counted(error: Exception) -> None:
    """Log that Redis failed the count: an unreachable Redis lets requests through."""
    logger.warning(
        "rate limits not counted (Redis: %s); the request goes on", str(error) or "timed out"
    )


def parse_rate(text: str) -> RateLimitItem | None:
    """``"100/second"``, ``"5000 per minute"``...; ``""`` is no limit.

    Raises:
        ValueError: Not a rate the ``limits`` library reads.
    """
    return parse(text) if text.strip() else None


class RateLimits:
    """The limits of a service, counted per key and scope in Redis.

    Args:
        client: The service's Redis client (its pool, with its credentials, is shared).
        key_prefix: refold's key prefix.
        rates: Per scope, its limit (``""``: none).
        url: The service's Redis URL, with its credentials: a cluster's client has no single
            pool to share, so the limiter opens its own (limits reads ``redis+cluster://`` too).
    """

    def __init__(
        self, client: redis.Redis, key_prefix: str, rates: Mapping[str, str], url: str = ""
    ) -> None:
        self.storage_prefix = prefix = f"{key_prefix}:ratelimit"
        storage: RedisStorage | RedisClusterStorage
        if is_cluster(client):
            storage = RedisClusterStorage(url, key_prefix=prefix)
        else:
            storage = RedisStorage(
                "redis://", connection_pool=client.connection_pool, key_prefix=prefix
            )
        self._limiter = FixedWindowRateLimiter(storage)
        self._items = {scope: item for scope, r in rates.items() if (item := parse_rate(r))}
        # (scope, key id) -> [requests left of this process's share, monotonic end of use]
        self._shares: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()
        # (scope, key id) -> the lock of taking its next share
        self._takers: dict[tuple[str, str], threading.Lock] = {}

    def admit_from_share(self, scope: str, key_id: str) -> bool:
        """Count one request from this process's share of the key's limit, without Redis.

        Returns:
            True when it was counted (or the scope has no limit); False when :meth:`check` must
            count it.
        """
        if scope not in self._items:
            return True
        with self._lock:
            share = self._shares.get((scope, key_id))
            if share is None or share[0] < 1 or time.monotonic() >= share[1]:
                return False
            share[0] -= 1
            return True

    def share_of(self, scope: str) -> tuple[RateLimitItem, int] | None:
        """The scope's limit and the share a process takes of it.

        None: its requests are counted one at a time (no limit, or one under
        ``2 * SHARE_DIVISOR``).
        """
        item = self._items.get(scope)
        if item is None or item.amount // SHARE_DIVISOR <= 1:
            return None
        return item, item.amount // SHARE_DIVISOR

    def check(self, scope: str, key_id: str) -> None:
        """Count one request of ``key_id`` in ``scope`` (in Redis, unless a share admits it).

        Raises:
            ApiError: 429 when the key is over the scope's limit.
        """
        if scope not in self._items or self.admit_from_share(scope, key_id):
            return
        shared = self.share_of(scope)
        if shared is not None:
            item, share = shared
            # One share taken at a time per key: the requests that found it spent meanwhile
            # (a worker holds several) wait for it, rather than each taking a share of its own
            # of which all but the last would be lost.
            with self._taking(scope, key_id):
                if self.admit_from_share(scope, key_id):
                    return
                try:
                    if self._limiter.hit(item, scope, key_id, cost=share):
                        self.keep_share(scope, key_id, share - 1, item.get_expiry())
                        return
                except redis.RedisError as exc:
                    _not_counted(exc)
                    return
        self.count_one(scope, key_id)

    def count_one(self, scope: str, key_id: str) -> None:
        """Count one request in Redis, without a share (:meth:`check`'s last step).

        Raises:
            ApiError: 429 when the key is over the scope's limit.
        """
        item = self._items.get(scope)
        if item is None:
            return
        try:
            if self._limiter.hit(item, scope, key_id):
                return
            reset = self._limiter.get_window_stats(item, scope, key_id).reset_time
        except redis.RedisError as exc:
            _not_counted(exc)
            return
        retry = max(1, math.ceil(reset - time.time()))
        msg = (
            f"key {key_id} made more {scope} requests than its limit of {item} "
            f"(REFOLD_SERVE__{scope.upper()}_RATE_LIMIT); retry after {retry}s"
        )
        raise ApiError(
            429, "RATE_LIMITED", msg, headers={"Retry-After": str(retry)}, limit=str(item)
        )

    def _taking(self, scope: str, key_id: str) -> threading.Lock:
        """The lock held while a share of the key's limit is taken."""
        with self._lock:
            if len(self._takers) >= _SHARES_ENTRIES:
                self._takers.clear()  # a holder keeps its lock; at worst two takers overlap
            return self._takers.setdefault((scope, key_id), threading.Lock())

    def keep_share(self, scope: str, key_id: str, left: int, window_s: float) -> None:
        """Keep ``left`` requests of a share just taken, for at most ``window_s``."""
        with self._lock:
            if len(self._shares) >= _SHARES_ENTRIES:
                self._shares.clear()
            self._shares[(scope, key_id)] = [float(left), time.monotonic() + window_s]


class LoopShares:
    """Shares of a :class:`RateLimits` taken on one event loop, with its asyncio Redis client.

    Make one per loop and client (the HTTP worker's context does), and use it from that loop.
    It counts in the same keys as the limits' own (blocking) client, with the `limits`
    library's asyncio limiter; one share is taken at a time per key, the loop's other requests
    of that key awaiting it.

    Args:
        limits: The service's limits.
        client: An asyncio client of the same Redis (not a cluster).
        timeout_s: The longest a share's round trip may take (the client may have none).
    """

    def __init__(self, limits: RateLimits, client: AsyncRedis, timeout_s: float) -> None:
        storage = AsyncRedisStorage(
            "async+redis://",
            implementation="redispy",
            # Its options are typed as scalars, but a pool is what the library asks for.
            connection_pool=client.connection_pool,  # type: ignore[arg-type]
            key_prefix=limits.storage_prefix,
        )
        self.limits = limits
        self.timeout_s = timeout_s
        self._limiter = AsyncFixedWindowRateLimiter(storage)
        self._taking: dict[tuple[str, str], asyncio.Task[bool | None]] = {}

    async def admit(self, scope: str, key_id: str) -> bool:
        """Count one request from a share, taking the next share when it is spent.

        Returns:
            True when the request goes on: counted, or not countable because Redis failed
            (logged, as :meth:`RateLimits.check` does); False when :meth:`RateLimits.count_one`
            must count it (a limit counted a request at a time, the key at its limit).
        """
        if self.limits.admit_from_share(scope, key_id):
            return True
        shared = self.limits.share_of(scope)
        if shared is None:
            return False
        key = (scope, key_id)
        taking = self._taking.get(key)
        if taking is None:
            taking = self._taking[key] = asyncio.ensure_future(self._take(key, *shared))
            taking.add_done_callback(lambda _: self._taking.pop(key, None))
        # Shielded: a request cancelled meanwhile leaves the share to the others.
        taken = await asyncio.shield(taking)
        if taken is None:
            # Redis failed or timed out: every request that awaited this share goes on, once
            # warned, rather than waiting again for a Redis that just failed (count_one would).
            return True
        return taken and self.limits.admit_from_share(scope, key_id)

    async def _take(self, key: tuple[str, str], item: RateLimitItem, share: int) -> bool | None:
        """Take the key's next share: True taken, False at the limit, None Redis failed."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if not await self._limiter.hit(item, *key, cost=share):
                    return False
        except (redis.RedisError, TimeoutError) as exc:
            _not_counted(exc)
            return None
        self.limits.keep_share(*key, share, item.get_expiry())
        return True
