"""Leases in Redis: at most one process holds a key; the processing lease of a generation.

A lease is a Redis key holding its owner (``host:pid:nonce``) with a TTL of
:data:`LEASE_TTL_MS`, renewed every two seconds by a background thread from when it is taken
until it is released. A lease left by a crashed process on the same host (its pid is gone) is
taken over at once, so a restart after ``kill -9`` does not wait for the expiry. One mechanism,
:class:`RedisLease`; its users name the key and the error a refusal raises:

- :class:`GenerationLease`: at most one processor runs a generation at a time. Two queries on
  one generation would share its Spark checkpoint and race on every batch. The exactly-once
  sink would keep the state right, but the checkpoint would not survive it. A processor
  therefore holds ``<gen>:lease`` from before its Spark session starts until its query has
  stopped. ``replay`` reads the lease to refuse an in-place reset of a generation that is being
  processed.
- :class:`BuilderLease`: the ``replay`` building a generation holds ``<gen>:builder`` from its
  creation until the flip (or its failure), so a ``building`` generation whose replay was
  killed (``kill -9``: no ``finally`` ran) shows as abandoned once the lease expires or its pid
  is gone.
- ``refold.services.webhooks.store.DispatcherLease``: at most one webhook dispatcher per name and
  role.

Lifecycle: one lease object per holder and key, used from the thread that acquires and releases
it; the renewer thread shares the redis-py client (its connection pool is thread-safe).
"""

from __future__ import annotations

import abc
import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING

import redis

from refold.contracts.errors import RefoldError
from refold.contracts.store.outage import REDIS_UNAVAILABLE, RedisOutage

if TYPE_CHECKING:
    from refold.contracts.store.generations import GenerationRegistry

__all__ = [
    "LEASE_TTL_MS",
    "BuilderLease",
    "GenerationLease",
    "LeaseHeldError",
    "RedisLease",
    "claim_lease",
    "lease_holder",
    "lease_holder_alive",
    "release_lease",
]

logger = logging.getLogger(__name__)

LEASE_TTL_MS = 15_000
# Well inside the TTL, also while Spark starts, a batch runs long or a webhook batch waits out
# a receiver's outage.
_RENEW_S = 2.0
_POLL_S = 0.25  # how often a waiting acquire asks again

# Compare-and-set scripts for the lease: plain GET/SET would race with another claimant.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) and 1 or 0
end
return 0
"""
# Renewing also re-takes a lease that expired while nobody else took it: Redis was unreachable
# for longer than the TTL (its clock ran on), or restarted from a backup without the key.
_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _never_gives_up(waited: float, exc: Exception) -> Exception:  # patience_s=None: unused
    return exc


class LeaseHeldError(RefoldError):
    """Another live process runs this generation."""

    code = "LEASE_HELD"


def _owner_id() -> str:
    # The format lease_holder_alive() reads: host:pid:nonce.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_holder_alive(owner: str) -> bool:
    """False only when ``owner`` is a process of this host that no longer exists."""
    host, _sep, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # another host: only the expiry can tell
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_holder(client: redis.Redis, key: str) -> str | None:
    """Who holds the lease ``key`` (``host:pid:nonce``), if anyone."""
    value = client.get(key)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def claim_lease(client: redis.Redis, key: str, owner: str, ttl_ms: int) -> bool:
    """Take the lease ``key`` for ``owner`` if it is free (SET NX PX)."""
    return bool(client.set(key, owner, nx=True, px=ttl_ms))


def release_lease(client: redis.Redis, key: str, owner: str) -> None:
    """Drop ``owner``'s lease ``key`` (no-op when it is not theirs)."""
    client.eval(_RELEASE, 1, key, owner)


class RedisLease(abc.ABC):
    """This process's lease on one Redis key (see the module docstring).

    :meth:`acquire` takes it and starts the renewer thread; :attr:`lost` is set when another
    owner holds the key at a renewal; :meth:`release` stops the renewer and lets go. Subclasses
    say what a refusal raises (:meth:`_refused`).

    Args:
        client: A redis-py client (shared with the renewer thread).
        key: The lease key.
        label: What is leased, for logs and the renewer thread's name (``g3``).
    """

    def __init__(self, client: redis.Redis, key: str, label: str) -> None:
        self.client = client
        self.key = key
        self.label = label
        self.owner = _owner_id()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @abc.abstractmethod
    def _refused(self, holder: str) -> RefoldError:
        """The error :meth:`acquire` raises when the live ``holder`` kept the lease too long."""

    def acquire(self, wait_s: float) -> None:
        """Take the lease, waiting up to ``wait_s`` for a live holder to let go.

        Raises:
            RefoldError: The subclass's refusal: another live process still holds it after
                ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            if claim_lease(self.client, self.key, self.owner, LEASE_TTL_MS):
                break
            holder = lease_holder(self.client, self.key)
            if holder is None:
                continue  # released or expired between the two calls
            if not lease_holder_alive(holder) and self.client.eval(
                _TAKE_OVER, 1, self.key, holder, self.owner, LEASE_TTL_MS
            ):
                logger.warning("took over the lease of %s from %s (gone)", self.label, holder)
                break
            if time.monotonic() > deadline:
                raise self._refused(holder)
            if not announced:
                logger.info("waiting for %s's lease, held by %s", self.label, holder)
                announced = True
            time.sleep(_POLL_S)
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"lease {self.label}", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self) -> None:
        # Redis unreachable for a moment (a restart, a failover): the TTL leaves time to retry,
        # and a lease that expired meanwhile is re-taken if nobody else took it. An outage is
        # one line when it starts and one when it ends (RedisOutage), not one per renewal.
        outage: RedisOutage | None = None
        while not self._stop.wait(0 if outage is not None else _RENEW_S):
            try:
                renewed = self.client.eval(_RENEW, 1, self.key, self.owner, LEASE_TTL_MS)
            except REDIS_UNAVAILABLE as exc:
                outage = outage or RedisOutage(
                    f"the renewal of the lease of {self.label}",
                    self.client,
                    _never_gives_up,
                    patience_s=None,
                    max_delay_s=_RENEW_S,
                    sleep=self._stop.wait,
                )
                try:
                    outage.wait(exc)
                except RefoldError:  # Redis refused the login: the lease cannot be kept
                    logger.exception("lost the lease of %s", self.label)
                    self.lost.set()
                    return
                continue
            except Exception:  # not an outage (a script error...): say it, try again later
                logger.warning("cannot renew the lease of %s", self.label, exc_info=True)
                continue
            if outage is not None:
                outage.over()
                outage = None
            if not renewed:
                logger.error("lost the lease of %s: another process took it over", self.label)
                self.lost.set()
                return

    def release(self) -> None:
        """Stop renewing and let go (no-op when it is not ours any more).

        Raises:
            redis.RedisError: Redis did not answer (the lease then expires by itself).
        """
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        release_lease(self.client, self.key, self.owner)


class GenerationLease(RedisLease):
    """This process's lease on one generation.

    Args:
        registry: The processor's registry.
        generation: The generation to run.
    """

    def __init__(self, registry: GenerationRegistry, generation: int) -> None:
        super().__init__(registry.client, registry.keys(generation).lease, f"g{generation}")
        self.registry = registry
        self.generation = generation

    def _refused(self, holder: str) -> LeaseHeldError:
        """Another processor runs the generation.

        Returns:
            The :class:`LeaseHeldError` :meth:`acquire` raises.
        """
        processor = self.registry.layout.processor
        msg = (
            f"{processor} g{self.generation} is being processed by {holder}; two "
            "processors on one generation are refused. Stop the other one, or wait "
            f"{LEASE_TTL_MS // 1000}s if it died on another host."
        )
        return LeaseHeldError(msg)


class BuilderLease(RedisLease):
    """The lease of the ``replay`` that builds a generation (held until the flip or failure).

    Args:
        registry: The processor's registry.
        generation: The generation being built.
    """

    def __init__(self, registry: GenerationRegistry, generation: int) -> None:
        super().__init__(
            registry.client, registry.keys(generation).builder, f"g{generation} (building)"
        )
        self.generation = generation

    def _refused(self, holder: str) -> LeaseHeldError:
        """Another replay builds the generation (never expected: each creates its own).

        Returns:
            The :class:`LeaseHeldError` :meth:`acquire` raises.
        """
        msg = f"g{self.generation} is being built by {holder}"
        return LeaseHeldError(msg)
