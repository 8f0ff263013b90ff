"""Idempotency keys of ``POST /v1/events``: a retried request is answered, not produced again.

A client sends ``Idempotency-Key: <any text>`` with a request and the same key with every retry
of it. The first request with a key claims it; what it produced is recorded under the key (in
Redis, ``IngestKeys``, for ``idempotency_horizon_s``):

- **done**: every event acknowledged. A retry with the same body gets the recorded answer
  (``Idempotent-Replayed: true``) and nothing is produced.
- **partial**: the broker did not acknowledge some events in time (503). A retry with the same
  body sends only the events without a delivery, and answers with all of them.
- **pending**: a request with the key is running (a retry now gets 409 ``IDEMPOTENCY_KEY_IN_USE``
  with ``Retry-After``). It expires after ``pending_s``, so a service that died mid-request
  does not hold the key for the whole horizon; a retry after that sends everything again.

The same key with another body gets 409 ``IDEMPOTENCY_KEY_REUSED``. What cannot be known stays
as the producer says (:class:`refold.services.errors.PublishError`): an event purged while in flight
at the timeout may still be in the log, and is sent again by the retry; de-duplication by event
id in the processors covers that case.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import redis
from redis.typing import EncodableT, FieldT

from refold.contracts.service_keys import IngestKeys

__all__ = ["Claim", "IdempotencyStore", "body_sha256"]

Delivery = dict[str, Any] | None  # {"topic", "partition", "offset"}, or None: not acknowledged

# KEYS[1]: the key's record (a hash). ARGV: the body's SHA-256, the pending TTL (ms).
# Returns {"new"}, {"resumed", deliveries} (a partial record of this body, taken over), or
# {state, body_sha256, response} of a record this request may not take.
_CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'body_sha256', ARGV[1], 'deliveries', '[]')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'new'}
end
local body = redis.call('HGET', KEYS[1], 'body_sha256')
if state == 'partial' and body == ARGV[1] then
  redis.call('HSET', KEYS[1], 'state', 'pending')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'resumed', redis.call('HGET', KEYS[1], 'deliveries')}
end
return {state, body, redis.call('HGET', KEYS[1], 'response') or ''}
"""


def body_sha256(events: list[tuple[str, dict[str, Any]]]) -> str:
    """The fingerprint of a request's events: the same events in the same order, the same hash."""
    return hashlib.sha256(orjson.dumps(events, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class Claim:
    """What claiming a key found.

    Attributes:
        outcome: ``new`` or ``resumed`` (this request owns the key now), else the state of an
            earlier request's record it may not take: ``pending``, ``partial`` (of another
            body) or ``done``.
        same_body: The record is of this request's body.
        deliveries: ``resumed``: what the earlier request delivered, per event index.
        response: ``done``: the recorded answer.
    """

    outcome: Literal["new", "resumed", "pending", "partial", "done"]
    same_body: bool = True
    deliveries: tuple[Delivery, ...] = ()
    response: dict[str, Any] | None = None


class IdempotencyStore:
    """The records of idempotency keys, in Redis (thread-safe: redis-py's pool).

    Args:
        client: Redis.
        prefix: Prefix of refold's Redis keys.
        horizon_s: How long a finished or partial request's record is kept.
        pending_s: How long a running request holds its key.
    """

    def __init__(self, client: redis.Redis, prefix: str, horizon_s: float, pending_s: float):
        self.client = client
        self.keys = IngestKeys(prefix)
        self.horizon_ms = int(horizon_s * 1000)
        self.pending_ms = int(pending_s * 1000)
        self._claim = client.register_script(_CLAIM)

    def _name(self, caller: str, key: str) -> str:
        return self.keys.idempotency(caller, hashlib.sha256(key.encode()).hexdigest())

    def claim(self, caller: str, key: str, body: str) -> Claim:
        """Claim ``key`` for a request of body fingerprint ``body``, or say who holds it.

        Raises:
            redis.RedisError: Redis did not answer.
        """
        found = [
            v.decode() if isinstance(v, bytes) else str(v)
            for v in self._claim(keys=[self._name(caller, key)], args=[body, self.pending_ms])
        ]
        if found[0] == "new":
            return Claim("new")
        if found[0] == "resumed":
            return Claim("resumed", deliveries=tuple(orjson.loads(found[1])))
        state, recorded, response = found
        return Claim(
            "done" if state == "done" else "partial" if state == "partial" else "pending",
            same_body=recorded == body,
            response=orjson.loads(response) if response else None,
        )

    def finish(
        self, caller: str, key: str, deliveries: list[Delivery], response: dict[str, Any]
    ) -> None:
        """Record a request every event of which was acknowledged, with its answer."""
        self._record(caller, key, "done", deliveries, response)

    def keep_partial(self, caller: str, key: str, deliveries: list[Delivery]) -> None:
        """Record what a request delivered before it failed (a retry sends the rest)."""
        self._record(caller, key, "partial", deliveries, None)

    def release(self, caller: str, key: str) -> None:
        """Drop a new claim of a request that sent nothing."""
        self.client.delete(self._name(caller, key))

    def _record(
        self,
        caller: str,
        key: str,
        state: str,
        deliveries: list[Delivery],
        response: dict[str, Any] | None,
    ) -> None:
        name = self._name(caller, key)
        fields: dict[FieldT, EncodableT] = {
            "state": state,
            "deliveries": orjson.dumps(deliveries),
            "at_ms": int(time.time() * 1000),
        }
        if response is not None:
            fields["response"] = orjson.dumps(response)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(name, mapping=fields)
            pipe.pexpire(name, self.horizon_ms)
            pipe.execute()
