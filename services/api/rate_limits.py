"""Per-key request rates: a key over its scope's limit gets 429 ``RATE_LIMITED`` with Retry-After.

The counts are fixed windows of the ``limits`` library, kept in Redis under
``<prefix>:ratelimit``, so every worker and every host of the service shares one count per key
and scope. Limits apply to the ``ingest`` and ``query`` scopes of authenticated keys (with
``auth=off`` there is no key to count by). An unreachable Redis lets requests through: the
limiter must not turn a store outage into an ingest outage.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import redis
from limits import RateLimitItem, parse
from limits.storage import RedisClusterStorage, RedisStorage
from limits.strategies import FixedWindowRateLimiter

from refold.contracts.store.connect import is_cluster
from refold.services.api.errors import ApiError

__all__ = ["RateLimits", "parse_rate"]

logger = logging.getLogger(__name__)


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
        prefix = f"{key_prefix}:ratelimit"
        storage: RedisStorage | RedisClusterStorage
        if is_cluster(client):
            storage = RedisClusterStorage(url, key_prefix=prefix)
        else:
            storage = RedisStorage(
                "redis://", connection_pool=client.connection_pool, key_prefix=prefix
            )
        self._limiter = FixedWindowRateLimiter(storage)
        self._items = {scope: item for scope, r in rates.items() if (item := parse_rate(r))}

    def check(self, scope: str, key_id: str) -> None:
        """Count one request of ``key_id`` in ``scope``.

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
            logger.warning("rate limits not counted (Redis: %s); the request goes on", exc)
            return
        retry = max(1, math.ceil(reset - time.time()))
        msg = (
            f"key {key_id} made more {scope} requests than its limit of {item} "
            f"(REFOLD_SERVE__{scope.upper()}_RATE_LIMIT); retry after {retry}s"
        )
        raise ApiError(
            429, "RATE_LIMITED", msg, headers={"Retry-After": str(retry)}, limit=str(item)
        )
