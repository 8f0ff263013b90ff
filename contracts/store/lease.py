"""The processing lease: at most one processor runs a generation at a time.

Two queries on one generation would share its Spark checkpoint and race on every batch. The
exactly-once sink would keep the state right, but the checkpoint would not survive it. A
processor therefore holds a lease in Redis (``<gen>:lease``, ``host:pid:nonce``, renewed every
two seconds by a background thread, expiring after :data:`LEASE_TTL_MS`) from before its Spark
session starts until its query has stopped.

A lease left by a crashed process on the same host (its pid is gone) is taken over at once, so
a restart after ``kill -9`` does not wait for the expiry. ``replay`` reads the lease to refuse
an in-place reset of a generation that is being processed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from contracts.errors import RefoldError
from contracts.store.generations import GenerationRegistry

__all__ = ["LEASE_TTL_MS", "GenerationLease", "LeaseHeldError", "lease_holder_alive"]

logger = logging.getLogger(__name__)

LEASE_TTL_MS = 15_000
_RENEW_S = 2.0  # well inside the TTL, also while Spark starts or a batch runs long
_POLL_S = 0.25


class LeaseHeldError(RefoldError):
    """Another live process runs this generation."""

    code = "LEASE_HELD"


def _owner_id() -> str:
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


class GenerationLease:
    """This process's lease on one generation.

    Args:
        registry: The processor's registry.
        generation: The generation to run.
    """

    def __init__(self, registry: GenerationRegistry, generation: int) -> None:
        self.registry = registry
        self.generation = generation
        self.owner = _owner_id()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, wait_s: float) -> None:
        """Take the lease, waiting up to ``wait_s`` for its holder to let go.

        Raises:
            LeaseHeldError: Another live process still holds it after ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            if self.registry.claim_lease(self.generation, self.owner, LEASE_TTL_MS):
                self._start_renewing()
                return
            holder = self.registry.lease_owner(self.generation)
            if holder is None:
                continue  # released or expired between the two calls
            if not lease_holder_alive(holder) and self.registry.take_over_lease(
                self.generation, holder, self.owner, LEASE_TTL_MS
            ):
                logger.warning("took over the lease of g%d from %s (gone)", self.generation, holder)
                self._start_renewing()
                return
            if time.monotonic() > deadline:
                processor = self.registry.layout.processor
                msg = (
                    f"{processor} g{self.generation} is being processed by {holder}; two "
                    "processors on one generation are refused. Stop the other one, or wait "
                    f"{LEASE_TTL_MS // 1000}s if it died on another host."
                )
                raise LeaseHeldError(msg)
            if not announced:
                logger.info("waiting for g%d's lease, held by %s", self.generation, holder)
                announced = True
            time.sleep(_POLL_S)

    def _start_renewing(self) -> None:
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"lease-g{self.generation}", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(_RENEW_S):
            try:
                renewed = self.registry.renew_lease(self.generation, self.owner, LEASE_TTL_MS)
            except Exception:  # Redis unreachable for a moment: the TTL leaves time to retry
                logger.warning("cannot renew the lease of g%d", self.generation, exc_info=True)
                continue
            if not renewed:
                logger.error("lost the lease of g%d", self.generation)
                self.lost.set()
                return

    def release(self) -> None:
        """Stop renewing and let go (no-op if it is not ours any more)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        self.registry.release_lease(self.generation, self.owner)
