"""API keys with scopes, stored hashed in Redis: :class:`ApiKeyStore`.

A key reads ``rfk_<id>_<secret>``: ``id`` (16 hex digits) names the key in listings, logs and
``refold keys revoke``; ``secret`` is 32 random bytes (``secrets.token_urlsafe``). Redis holds
only the SHA-256 of the whole key, in one hash
(:class:`refold.contracts.service_keys.ApiKeyKeys`), so every replica of the services sees a key
added or revoked on its next request (or within ``cache_s``), without a restart.

Why SHA-256 and not bcrypt, scrypt or Argon2: those slow hashes exist to protect passwords,
which are guessable; stretching makes each guess costly. A key here carries 256 bits from the
operating system's CSPRNG, so no guessing is feasible however fast the hash, and a leaked
registry reveals no key. A slow hash would instead cost tens of milliseconds on every request.
(The same reasoning as GitHub's and Stripe's token storage.)

Lifecycle: one store per process (or per app); the redis-py client it is given may be shared
between threads, and the store's cache is safe to use from any thread.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson
import redis

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.service_keys import ApiKeyKeys
from refold.services.auth.errors import (
    ApiKeyNameTakenError,
    ApiKeySpecError,
    ApiKeyStoreError,
    UnknownApiKeyError,
)

__all__ = [
    "KEY_PREFIX",
    "SCOPES",
    "ApiKey",
    "ApiKeyStatus",
    "ApiKeyStore",
    "Scope",
    "hash_key",
    "parse_key",
]

Scope = Literal["ingest", "query", "admin"]
# Every scope, in display order. ``admin`` implies the others.
SCOPES: tuple[Scope, ...] = ("ingest", "query", "admin")
ApiKeyStatus = Literal["active", "expired", "revoked"]
# Marks refold keys, so that secret scanners (and people) recognise a leaked one.
KEY_PREFIX = "rfk"
_ID_HEX_DIGITS = 16  # 64 random bits: unique among any number of keys one deployment makes
_SECRET_BYTES = 32  # 256 random bits: beyond any guessing (see the module docstring)
_ID = re.compile(rf"[0-9a-f]{{{_ID_HEX_DIGITS}}}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
# Entries of the verification cache at most (a stream of distinct valid keys refills it).
_CACHE_ENTRIES = 10_000


def parse_key(presented: str) -> str | None:
    """The id of a key of the form ``rfk_<id>_<secret>``, or None when it has not that form."""
    head, sep, rest = presented.partition("_")
    key_id, sep2, secret = rest.partition("_")
    if head != KEY_PREFIX or not (sep and sep2 and secret) or not _ID.fullmatch(key_id):
        return None
    return key_id


def hash_key(presented: str) -> str:
    """The SHA-256 (hex) stored for a key (see the module docstring for why SHA-256)."""
    return hashlib.sha256(presented.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One API key as stored: everything but the key itself.

    Attributes:
        id: Its id (the ``<id>`` of ``rfk_<id>_<secret>``).
        name: Who or what it is for; unique among the keys not revoked.
        scopes: What it may do (``admin``: everything).
        created_at: When it was made (epoch ms).
        expires_at: When it stops working (epoch ms), or None: never.
        revoked_at: When it was revoked (epoch ms), or None.
    """

    id: str
    name: str
    scopes: tuple[Scope, ...]
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None

    def allows(self, scope: Scope) -> bool:
        """True when the key has ``scope``, or ``admin`` (which implies every scope)."""
        return scope in self.scopes or "admin" in self.scopes

    def status(self, now_ms: int) -> ApiKeyStatus:
        """``revoked``, ``expired`` (at ``now_ms``) or ``active``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now_ms:
            return "expired"
        return "active"

    def describe(self) -> dict[str, Any]:
        """JSON-ready fields (``refold keys list --json``): never the key, nor its hash."""
        return {
            "id": self.id,
            "name": self.name,
            "scopes": list(self.scopes),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
        }


def _scopes(scopes: Iterable[str]) -> tuple[Scope, ...]:
    given = set(scopes)
    unknown = sorted(given - set(SCOPES))
    if unknown:
        msg = f"unknown scope(s) {', '.join(unknown)}: choose from {', '.join(SCOPES)}"
        raise ApiKeySpecError(msg)
    if not given:
        msg = f"a key needs at least one scope ({', '.join(SCOPES)})"
        raise ApiKeySpecError(msg)
    return tuple(s for s in SCOPES if s in given)


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        msg = (
            f"invalid key name {name!r}: 1 to 64 letters, digits and . _ @ + -, starting with "
            "a letter or digit"
        )
        raise ApiKeySpecError(msg)
    if _ID.fullmatch(name):
        msg = f"invalid key name {name!r}: it looks like a key id (16 hex digits)"
        raise ApiKeySpecError(msg)


def _record(key: ApiKey, digest: str) -> bytes:
    return orjson.dumps({**key.describe(), "sha256": digest})


def _decode(raw: bytes | str) -> tuple[ApiKey, str]:
    """``(key, sha256)`` of a stored record."""
    try:
        data = orjson.loads(raw)
        key = ApiKey(
            id=str(data["id"]),
            name=str(data["name"]),
            scopes=tuple(cast(Scope, s) for s in data["scopes"] if s in SCOPES),
            created_at=int(data["created_at"]),
            expires_at=None if data.get("expires_at") is None else int(data["expires_at"]),
            revoked_at=None if data.get("revoked_at") is None else int(data["revoked_at"]),
        )
        return key, str(data["sha256"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        msg = (
            "an API key record in Redis cannot be read. Operator action: revoke the key "
            "(refold keys revoke <id>) and make a new one."
        )
        raise ApiKeyStoreError(msg) from exc


class ApiKeyStore:
    """API keys in Redis: add, list, revoke, and verify a presented key.

    Args:
        client: redis-py client (``decode_responses`` either way).
        key_prefix: Prefix of refold's Redis keys.
        cache_s: How long :meth:`lookup` may answer a key from memory (0: never). A revocation
            reaches a process that cached the key within this time; an expiry is exact.
        clock: Wall clock (epoch seconds), for tests.
    """

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        *,
        cache_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.registry = ApiKeyKeys(key_prefix).registry
        self.cache_s = cache_s
        self._clock = clock
        # sha256 -> (key, monotonic time it was read). Dict reads and writes are atomic.
        self._cache: dict[str, tuple[ApiKey, float]] = {}

    def now_ms(self) -> int:
        """The store's clock, in epoch ms."""
        return int(self._clock() * 1000)

    def add(self, name: str, scopes: Iterable[str], *, expires_in_s: float | None = None) -> str:
        """Make a key; the returned string is the only copy of it (Redis keeps its hash).

        Args:
            name: Who or what it is for (e.g. ``checkout-service``); unique among the keys
                not revoked, since ``revoke`` accepts names.
            scopes: Any of ``ingest``, ``query``, ``admin``.
            expires_in_s: Seconds until it stops working (None: never).

        Returns:
            The key, ``rfk_<id>_<secret>``.

        Raises:
            ApiKeySpecError: Invalid name, scope or expiry.
            ApiKeyNameTakenError: A key that is not revoked has this name.
            ApiKeyStoreError: Redis failed.
        """
        _check_name(name)
        chosen = _scopes(scopes)
        if expires_in_s is not None and not expires_in_s > 0:
            msg = f"expiry must be in the future, not in {expires_in_s} s"
            raise ApiKeySpecError(msg)
        key_id = secrets.token_hex(_ID_HEX_DIGITS // 2)
        presented = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
        now = self.now_ms()
        expires_at = None if expires_in_s is None else now + int(expires_in_s * 1000)
        key = ApiKey(key_id, name, chosen, now, expires_at)

        def _add(pipe: redis.client.Pipeline) -> None:
            for other in self._records(pipe.hvals(self.registry)):
                if other.name == name and other.revoked_at is None:
                    msg = (
                        f"a key named {name!r} exists (id {other.id}, scopes "
                        f"{', '.join(other.scopes)}): revoke it first (refold keys revoke "
                        f"{other.id}) or choose another name"
                    )
                    raise ApiKeyNameTakenError(msg)
            pipe.multi()
            pipe.hset(self.registry, key_id, _record(key, hash_key(presented)))

        self._transaction(_add)
        return presented

    def cached(self, presented: str) -> ApiKey | None:
        """:meth:`lookup`'s answer from memory, if it is fresh; never touches Redis.

        For callers on an event loop: only a miss needs :meth:`lookup` on a thread.
        """
        if self.cache_s <= 0:
            return None
        cached = self._cache.get(hash_key(presented))
        if cached is not None and time.monotonic() - cached[1] < self.cache_s:
            return cached[0]
        return None

    def lookup(self, presented: str) -> ApiKey | None:
        """The stored key ``presented`` is, whatever its status; None when it is no key.

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        key_id = parse_key(presented)
        if key_id is None:
            return None
        cached = self.cached(presented)
        if cached is not None:
            return cached
        digest = hash_key(presented)
        try:
            raw = self.client.hget(self.registry, key_id)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc
        if raw is None:
            return None
        key, stored = _decode(raw)
        if not hmac.compare_digest(stored, digest):
            return None
        if self.cache_s > 0:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[digest] = (key, time.monotonic())
        return key

    def record_of(self, key_id: str) -> bytes | None:
        """The stored record of a key (what the journal keeps), None when there is none.

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        try:
            raw = self.client.hget(self.registry, key_id)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc
        return raw.encode() if isinstance(raw, str) else raw

    def restore(self, records: Mapping[str, bytes]) -> int:
        """Write journal records of keys the store does not have (never overwrites one).

        Returns:
            How many were written.

        Raises:
            ApiKeyStoreError: Redis failed, or a record cannot be read (nothing written).
        """
        for raw in records.values():
            _decode(raw)  # refuse a broken journal before writing any of it
        try:
            with self.client.pipeline(transaction=True) as pipe:
                for key_id, raw in sorted(records.items()):
                    pipe.hsetnx(self.registry, key_id, raw)
                written = pipe.execute()
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc
        self._cache.clear()
        return sum(1 for w in written if w)

    def forget(self, key_id: str) -> None:
        """Delete a key's record (a key whose journal record the broker refused is taken back).

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        try:
            self.client.hdel(self.registry, key_id)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc
        self._cache.clear()

    def empty(self) -> bool:
        """True when the store holds no key at all (revoked ones count as keys).

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        try:
            return not self.client.exists(self.registry)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc

    def verify(self, presented: str) -> ApiKey | None:
        """The key ``presented`` is, if it is active (not revoked, not expired); else None.

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        key = self.lookup(presented)
        return key if key is not None and key.status(self.now_ms()) == "active" else None

    def get(self, id_or_name: str) -> ApiKey:
        """The key with this id (or whole key string), else the unrevoked key with this name.

        Raises:
            UnknownApiKeyError: None has it.
            ApiKeyStoreError: Redis failed.
        """
        return self._find(self.list(include_revoked=True), id_or_name)

    def revoke(self, id_or_name: str) -> ApiKey:
        """Revoke a key by id, whole key string or name; every replica refuses it from then.

        Revoking a revoked key changes nothing (the record keeps its first ``revoked_at``).

        Returns:
            The key as revoked.

        Raises:
            UnknownApiKeyError: No key has this id, and no unrevoked key this name.
            ApiKeyStoreError: Redis failed.
        """
        done: list[ApiKey] = []

        def _revoke(pipe: redis.client.Pipeline) -> None:
            done.clear()  # a retried transaction starts over
            found = self._find(self._records(pipe.hvals(self.registry)), id_or_name)
            if found.revoked_at is not None:
                done.append(found)
                return
            revoked = ApiKey(
                found.id,
                found.name,
                found.scopes,
                found.created_at,
                found.expires_at,
                self.now_ms(),
            )
            stored = _decode(cast(bytes | str, pipe.hget(self.registry, found.id)))[1]
            pipe.multi()
            pipe.hset(self.registry, found.id, _record(revoked, stored))
            done.append(revoked)

        self._transaction(_revoke)
        self._cache.clear()  # this process, at least, refuses it at once
        return done[0]

    def list(self, *, include_revoked: bool = False) -> builtins.list[ApiKey]:
        """The keys, oldest first (revoked ones only with ``include_revoked``).

        Raises:
            ApiKeyStoreError: Redis failed.
        """
        try:
            raw = self.client.hvals(self.registry)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc
        keys = self._records(raw)
        return [k for k in keys if include_revoked or k.revoked_at is None]

    @staticmethod
    def _records(raw: Any) -> builtins.list[ApiKey]:
        keys = [_decode(value)[0] for value in cast(builtins.list[bytes | str], raw)]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    @staticmethod
    def _find(keys: builtins.list[ApiKey], id_or_name: str) -> ApiKey:
        wanted = parse_key(id_or_name) or id_or_name
        for key in keys:
            if key.id == wanted:
                return key
        for key in keys:
            if key.name == wanted and key.revoked_at is None:
                return key
        names = ", ".join(sorted({k.name for k in keys if k.revoked_at is None})) or "none"
        msg = f"no API key has the id or name {id_or_name!r} (keys not revoked: {names})"
        raise UnknownApiKeyError(msg)

    def _transaction(self, body: Callable[[redis.client.Pipeline], None]) -> None:
        try:
            self.client.transaction(body, self.registry)
        except redis.RedisError as exc:
            raise ApiKeyStoreError(self._unreachable(exc)) from exc

    def _unreachable(self, exc: redis.RedisError) -> str:
        return (
            f"cannot reach the API keys in Redis ({self.registry}): {str(exc).rstrip('.')}. "
            "Operator action: check that Redis is up and REFOLD_REDIS__* (url, username, "
            "password)."
        )
