"""The dispatcher's Redis side: positions, the delivery log, counters, and its lease.

Keys are :class:`refold.contracts.service_keys.WebhookKeys`. A batch's outcome is committed in
one Lua call: it checks that this process still holds the lease (taking it again when it is
gone: a Redis that restarted empty), then writes the next offset per partition, one log entry
per insight and the counters. A dispatcher that lost its lease (a zombie after a long pause)
therefore never moves positions under the one that took over.

Lifecycle: one :class:`WebhookStore` per dispatcher; the redis-py client it is given may be
shared between threads (its connection pool is thread-safe).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, cast

import redis

from refold.contracts.layout import parse_position_field, position_field
from refold.contracts.service_keys import WebhookKeys
from refold.contracts.store.lease import LEASE_TTL_MS, RedisLease
from refold.contracts.store.outage import wait_out_redis
from refold.contracts.store.scan import scan_names
from refold.services.webhooks.errors import WebhookLeaseError, WebhookStoreError

__all__ = [
    "DispatcherLease",
    "LogEntry",
    "WebhookStore",
    "list_dispatchers",
]

logger = logging.getLogger(__name__)

# How long a commit keeps trying while Redis is unreachable (a restart, a failover) before the
# dispatcher stops; the batch stays uncommitted, so a restart delivers it again.
_COMMIT_PATIENCE_S = 120.0

# Both scripts first check the lease: 0 when another dispatcher holds it. A lease that is gone
# (Redis restarted empty or was flushed; or it expired and nobody took it) is taken again, as
# the renewer does: else the dispatcher stopped at its next commit, and its delivered but
# uncommitted insights went out again after a restart.
_HOLD_LEASE = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[#ARGV])
elseif holder ~= ARGV[1] then
  return 0
end
"""
# KEYS: lease, positions, log, counters. ARGV: owner, maxlen, positions, counters, entries
# (JSON: {field: "offset"}, {name: n}, [[field, value, ...], ...]), lease TTL (ms).
_COMMIT = (
    _HOLD_LEASE
    + """
for field, offset in pairs(cjson.decode(ARGV[3])) do
  redis.call('HSET', KEYS[2], field, offset)
end
for name, n in pairs(cjson.decode(ARGV[4])) do
  redis.call('HINCRBY', KEYS[4], name, n)
end
for _, entry in ipairs(cjson.decode(ARGV[5])) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', unpack(entry))
end
return 1
"""
)
# KEYS: lease, positions. ARGV: owner, {field: "offset"}: set only the fields not set yet,
# lease TTL (ms).
_INIT_POSITIONS = (
    _HOLD_LEASE
    + """
for field, offset in pairs(cjson.decode(ARGV[2])) do
  redis.call('HSETNX', KEYS[2], field, offset)
end
return 1
"""
)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of the delivery log.

    Attributes:
        id: The Idempotency-Key the insight was (or would have been) delivered with.
        topic: The insight record's topic (for a redriven one: the topic it first came from).
        partition: Its partition.
        offset: Its offset.
        status: ``delivered``, ``retry`` (an attempt failed, another follows), ``failed``
            (dead-lettered: see ``reason``).
        code: The last HTTP status (0: none, e.g. a timeout or a refused connection).
        attempts: Attempts made so far.
        latency_ms: Duration of the last attempt.
        elapsed_ms: From the first attempt to this outcome.
        time_ms: When (epoch ms).
        reason: For ``failed``: ``webhook-failed``, ``webhook-rejected`` or the decoder's
            reason (``bad-magic``, ``unknown-fingerprint``, ``bad-body``).
        error: The last error (``HTTP 503``, ``ConnectError: ...``).
        run: ``dispatch`` or ``redrive``.
        entry_id: The stream entry's id (set when read back).
    """

    id: str
    topic: str
    partition: int
    offset: int
    status: str
    code: int
    attempts: int
    latency_ms: float
    elapsed_ms: float
    time_ms: int
    reason: str = ""
    error: str = ""
    run: str = "dispatch"
    entry_id: str = ""

    def flat(self) -> list[str]:
        """``[field, value, ...]`` as XADD takes them (without the entry id)."""
        out: list[str] = []
        for name in _STORED_FIELDS:
            value = getattr(self, name)
            out += [name, f"{value:.1f}" if isinstance(value, float) else str(value)]
        return out

    @classmethod
    def from_stream(cls, entry_id: bytes | str, raw: Mapping[bytes, bytes]) -> LogEntry:
        """Read one stream entry back (unknown fields ignored, missing ones zero or empty)."""
        data = {k.decode(): v.decode() for k, v in raw.items()}
        values: dict[str, Any] = {}
        for name in _STORED_FIELDS:
            text = data.get(name, "")
            kind = _FIELD_TYPES[name]
            if kind == "int":
                values[name] = int(text) if text.lstrip("-").isdigit() else 0
            elif kind == "float":
                try:
                    values[name] = float(text)
                except ValueError:
                    values[name] = 0.0
            else:
                values[name] = text
        entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return cls(**values, entry_id=entry)


_STORED_FIELDS = tuple(f.name for f in fields(LogEntry) if f.name != "entry_id")
_FIELD_TYPES = {f.name: str(f.type) for f in fields(LogEntry)}  # "int", "float", "str"


class WebhookStore:
    """Positions, log and counters of one dispatcher.

    Args:
        client: A redis-py client (bytes responses).
        keys: The dispatcher's keys.
        log_max_entries: Approximate cap of the log stream.
    """

    def __init__(self, client: redis.Redis, keys: WebhookKeys, log_max_entries: int) -> None:
        self.client = client
        self.keys = keys
        self.log_max_entries = log_max_entries
        self._commit = client.register_script(_COMMIT)
        self._init = client.register_script(_INIT_POSITIONS)

    def positions(self) -> dict[tuple[str, int], int]:
        """The stored next offset of every ``(topic, partition)``."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.positions))
        out: dict[tuple[str, int], int] = {}
        for field, value in raw.items():
            parsed = parse_position_field(field.decode())
            if parsed is not None:
                out[parsed] = int(value)
        return out

    def init_positions(self, lease: DispatcherLease, start: Mapping[tuple[str, int], int]) -> None:
        """Store where partitions without a position start (those with one keep theirs).

        Raises:
            WebhookLeaseError: The lease is not ours any more.
            WebhookStoreError: Redis did not answer in time.
        """
        if not start:
            return
        encoded = json.dumps({position_field(t, p): str(o) for (t, p), o in start.items()})
        self._run(
            "storing starting positions",
            lambda: self._init(
                keys=[lease.key, self.keys.positions], args=[lease.owner, encoded, LEASE_TTL_MS]
            ),
        )

    def commit(
        self,
        lease: DispatcherLease,
        positions: Mapping[tuple[str, int], int],
        entries: Iterable[LogEntry],
        counters: Mapping[str, int],
    ) -> None:
        """Write a batch's outcome in one call: positions, log entries, counters.

        Raises:
            WebhookLeaseError: The lease is not ours any more (nothing was written).
            WebhookStoreError: Redis did not answer in time (nothing was written).
        """
        args = [
            lease.owner,
            str(self.log_max_entries),
            json.dumps({position_field(t, p): str(o) for (t, p), o in positions.items()}),
            json.dumps({k: v for k, v in counters.items() if v}),
            json.dumps([e.flat() for e in entries]),
            str(LEASE_TTL_MS),
        ]
        keys = [lease.key, self.keys.positions, self.keys.log, self.keys.counters]
        self._run("committing a batch", lambda: self._commit(keys=keys, args=args))

    def _run(self, what: str, call: Any) -> None:
        def give_up(waited: float, exc: Exception) -> WebhookStoreError:
            return WebhookStoreError(
                f"Redis unreachable for {waited:.0f}s while {what} ({exc}); the batch stays "
                "uncommitted and is delivered again on restart. Operator action: check Redis "
                "(REFOLD_REDIS__URL), then restart the dispatcher."
            )

        who = f"the webhook dispatcher {self.keys.name}"
        done = wait_out_redis(
            call, who, self.client, give_up, patience_s=_COMMIT_PATIENCE_S, first_delay_s=0.1
        )
        if not done:
            msg = (
                f"{self.keys.name}: lost the dispatcher lease while {what}: another dispatcher "
                "of this name took over; this one stops without writing."
            )
            raise WebhookLeaseError(msg)

    def log_retry(self, entry: LogEntry) -> None:
        """Append a ``retry`` entry at once (best effort: a failure is only logged)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(
                self.keys.log,
                dict(zip(entry.flat()[::2], entry.flat()[1::2], strict=True)),
                maxlen=self.log_max_entries,
                approximate=True,
            )
            pipe.hincrby(self.keys.counters, "retried", 1)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not log a retry of %s: %s", entry.id, exc)

    def counters(self) -> dict[str, int]:
        """The counters (``delivered``, ``retried``, ``failed``, ``failed:<reason>``...)."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys.counters))
        return {k.decode(): int(v) for k, v in raw.items()}

    def recent(self, count: int) -> list[LogEntry]:
        """The newest ``count`` log entries, newest first."""
        raw = cast(
            "list[tuple[bytes, dict[bytes, bytes]]]",
            self.client.xrevrange(self.keys.log, count=count),
        )
        return [LogEntry.from_stream(entry_id, data) for entry_id, data in raw]

    def log_length(self) -> int:
        """Entries in the log stream now."""
        return int(self.client.xlen(self.keys.log))


def list_dispatchers(client: redis.Redis, prefix: str) -> list[str]:
    """Names of the dispatchers that have counters under ``prefix``."""
    names = {
        WebhookKeys.name_of(key, prefix) for key in scan_names(client, WebhookKeys.pattern(prefix))
    }
    return sorted(n for n in names if n)


class DispatcherLease(RedisLease):
    """At most one process per dispatcher name and role (``dispatch``, ``redrive``).

    Two dispatchers of one name would both deliver (duplicates, same keys) and race on the
    positions. The lease is :class:`~refold.contracts.store.lease.RedisLease`'s (``host:pid:nonce``
    with a TTL, renewed by a background thread, a crashed holder of this host taken over at
    once) on the key :meth:`WebhookKeys.lease`; a refusal raises :class:`WebhookLeaseError`.

    Args:
        client: A redis-py client.
        keys: The dispatcher's keys.
        role: ``dispatch`` or ``redrive`` (they may run at the same time).
    """

    def __init__(self, client: redis.Redis, keys: WebhookKeys, role: str) -> None:
        super().__init__(client, keys.lease(role), f"{keys.name} ({role})")

    def _refused(self, holder: str) -> WebhookLeaseError:
        """Another dispatcher of this name and role runs.

        Returns:
            The :class:`WebhookLeaseError` :meth:`acquire` raises.
        """
        msg = (
            f"webhook dispatcher {self.label} is running as {holder}; two are refused. "
            f"Operator action: stop the other one, or wait {LEASE_TTL_MS // 1000}s if it "
            "died on another host."
        )
        return WebhookLeaseError(msg)

    def release(self) -> None:
        """Stop renewing and let go (best effort: a lease Redis does not drop expires)."""
        try:
            super().release()
        except redis.RedisError:  # it expires by itself
            logger.warning("could not release the lease of %s", self.label, exc_info=True)
