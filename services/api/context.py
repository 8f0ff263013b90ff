"""What every route shares: settings and the clients, created once per process, lazily.

Routes get it through FastAPI's dependency injection (``Depends(get_context)``), never from a
module-level singleton, so that tests build as many apps as they like.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from fastapi import Request
from redis.asyncio import Redis as AsyncRedis

from refold.contracts.kafka.offsets import LogOffsets, OffsetsError
from refold.contracts.registry import default_registry
from refold.contracts.store.autopipeline import AutoPipeline
from refold.contracts.store.connect import async_redis_client, is_cluster, redis_client
from refold.contracts.topics import TopicSpec
from refold.services.api.config import ServeSettings
from refold.services.api.rate_limits import LoopShares, RateLimits
from refold.services.ingest.idempotency import IdempotencyStore
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader

__all__ = ["REDIS_TIMEOUT_S", "ServiceContext", "get_context"]

# A broker that does not answer a lag probe within this is "unknown".
_OFFSETS_TIMEOUT_S = 5.0
# A Redis that does not answer within this fails the request (503), instead of holding a worker:
# most query routes call Redis on the event loop, blocking (see services/query/routes.py).
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class _LoopClients:
    """An event loop's asyncio Redis client and what uses it."""

    loop: asyncio.AbstractEventLoop
    client: AsyncRedis
    pipeline: AutoPipeline
    shares: LoopShares


@dataclass
class ServiceContext:
    """The settings and clients of one app. Thread-safe: routes run on a thread pool.

    Attributes:
        settings: The service's settings.
        redis: redis-py client (a connection pool; safe to share between threads).
        topics: Where ingest publishes each event type (default: the topics of the installed
            contract sets).
        redis_url: The URL of ``redis``'s server, for an asyncio client of it (the entity
            reads' round trip, :meth:`async_redis`); None: those reads block the loop instead.
    """

    settings: ServeSettings
    redis: redis.Redis
    topics: Sequence[TopicSpec] | None = None
    redis_url: str | None = None
    _publisher: EventPublisher | None = field(default=None, init=False)
    _offsets: LogOffsets | None = field(default=None, init=False)
    # One publish call at a time: EventPublisher purges its whole queue when a call times
    # out, which would take other calls' events with it (see EventPublisher).
    publish_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _offsets_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _closed: bool = field(default=False, init=False)
    _rate_limits: RateLimits | None = field(default=None, init=False)
    _idempotency: IdempotencyStore | None = field(default=None, init=False)
    _readers: dict[str, StateReader] = field(default_factory=dict, init=False)
    # The asyncio client and what uses it, of the loop they belong to (uvicorn's worker has one
    # loop for life).
    _async_redis: _LoopClients | None = field(default=None, init=False)

    @classmethod
    def from_settings(cls, settings: ServeSettings) -> ServiceContext:
        """Clients from the settings (Redis AUTH/ACL and TLS pass through ``RedisSettings``)."""
        topics = None
        if settings.serve.topics:
            renames = settings.serve.topics
            topics = [
                dataclasses.replace(spec, name=renames.get(spec.name, spec.name))
                for spec in default_registry().topics.values()
            ]
        url = settings.redis.client_url()
        client = redis_client(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        return cls(settings, client, topics, redis_url=url)

    @property
    def key_prefix(self) -> str:
        """Prefix of refold's Redis keys."""
        return self.settings.redis.key_prefix

    def publisher(self) -> EventPublisher:
        """The process's producer SDK (Kafka SASL/TLS pass through ``KafkaSettings``)."""
        if self._publisher is None:
            with self.publish_lock:
                if self._publisher is None:
                    self._publisher = EventPublisher(
                        self.settings.kafka, topics=self.topics, who="HTTP ingest"
                    )
        return self._publisher

    def idempotency(self) -> IdempotencyStore:
        """The records of ingest's idempotency keys (in Redis)."""
        if self._idempotency is None:
            serve = self.settings.serve
            # A request holds its key while it waits for the publish lock and for the broker.
            pending_s = 2 * serve.ingest_timeout_s + 30
            self._idempotency = IdempotencyStore(
                self.redis, self.key_prefix, serve.idempotency_horizon_s, pending_s
            )
        return self._idempotency

    def reader(self, processor: str) -> StateReader:
        """The process's reader of a registered ``processor``'s state.

        One per processor: it remembers the live generation between reads (:class:`StateReader`).
        """
        found = self._readers.get(processor)
        if found is None:
            found = self._readers.setdefault(
                processor, StateReader(self.redis, processor, self.key_prefix)
            )
        return found

    def async_redis(self) -> AsyncRedis | None:
        """The asyncio client of the running loop (made on first use); None without one.

        None on a Redis Cluster (the reads it serves are single-server scripts) and when the
        context was given no ``redis_url``. A new loop (a test harness's) gets a new client.
        Its commands have no timeout of their own: bound each round trip with
        :data:`REDIS_TIMEOUT_S`.
        """
        made = self._loop_clients()
        return None if made is None else made.client

    def redis_pipeline(self) -> AutoPipeline | None:
        """The auto-pipeline of :meth:`async_redis`'s client; None without one.

        Commands awaited in one turn of the loop (the reads of the requests a worker holds)
        share one round trip, bounded by :data:`REDIS_TIMEOUT_S`.
        """
        made = self._loop_clients()
        return None if made is None else made.pipeline

    def loop_shares(self) -> LoopShares | None:
        """The rate limits' shares taken with :meth:`async_redis`'s client; None without one."""
        made = self._loop_clients()
        return None if made is None else made.shares

    def _loop_clients(self) -> _LoopClients | None:
        made = self._async_redis
        loop = asyncio.get_running_loop()
        if made is not None and made.loop is loop:
            return made
        if self.redis_url is None or is_cluster(self.redis):
            return None
        # No socket timeout (redis-py 8 sets 5 s unless told): the auto-pipeline bounds each
        # round trip with one asyncio.timeout of REDIS_TIMEOUT_S, cheaper than the client's (a
        # task per write, asyncio.wait_for, and a timeout per reply read).
        client = async_redis_client(
            self.redis_url, socket_timeout=None, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        made = self._async_redis = _LoopClients(
            loop,
            client,
            AutoPipeline(client, REDIS_TIMEOUT_S),
            LoopShares(self.rate_limits(), client, REDIS_TIMEOUT_S),
        )
        return made

    async def close_async_redis(self) -> None:
        """Close the running loop's asyncio client, if it has one (the app's lifespan does)."""
        made = self._async_redis
        if made is not None and made.loop is asyncio.get_running_loop():
            self._async_redis = None
            await made.client.aclose()

    def rate_limits(self) -> RateLimits:
        """The per-key request limits (counted in Redis)."""
        if self._rate_limits is None:
            serve = self.settings.serve
            rates = {"ingest": serve.ingest_rate_limit, "query": serve.query_rate_limit}
            self._rate_limits = RateLimits(
                self.redis, self.key_prefix, rates, url=self.settings.redis.client_url()
            )
        return self._rate_limits

    @contextmanager
    def offsets(self) -> Iterator[LogOffsets]:
        """The log-end reader, one caller at a time (its consumer is not thread-safe)."""
        with self._offsets_lock:
            if self._closed:  # never a new client after close (it would outlive the app)
                msg = "the service is shutting down"
                raise OffsetsError(msg)
            if self._offsets is None:
                self._offsets = LogOffsets(
                    self.settings.kafka.as_librdkafka(), timeout=_OFFSETS_TIMEOUT_S
                )
            yield self._offsets

    def close(self) -> None:
        """Flush the producer, close the Kafka clients and the Redis pool (each, whatever fails)."""
        try:
            if self._publisher is not None:
                self._publisher.close()
        finally:
            try:
                with self._offsets_lock:  # not while a lag probe uses it (waits its timeout)
                    self._closed = True
                    if self._offsets is not None:
                        self._offsets.close()
                        self._offsets = None
            finally:
                self.redis.close()


async def get_context(request: Request) -> ServiceContext:
    """FastAPI dependency: the app's context (async: no I/O, so no hop to the thread pool)."""
    context: ServiceContext = request.app.state.context
    return context
