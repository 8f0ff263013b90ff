"""``require(scope)``: the FastAPI dependency that guards a route with an API key.

The key comes in ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. Answers:

- no key, or one that is unknown, revoked or expired: 401 ``UNAUTHENTICATED`` with
  ``WWW-Authenticate: Bearer`` (RFC 6750), saying which of these it is;
- a valid key without the scope: 403 ``FORBIDDEN``, naming the key's scopes and the one needed;
- Redis unreachable: 503 ``AUTH_UNAVAILABLE`` with ``Retry-After``.

``admin`` implies every scope. With ``REFOLD_SERVE__AUTH=off`` every request passes.

Keys are checked against Redis, with a cache of :data:`VERIFY_CACHE_S` per app: a key revoked
with ``refold keys revoke`` is refused by every replica within that time, without a restart.
A cached key is answered on the event loop; only a miss goes to Redis, on a worker thread. So
is a request its key's share of the rate limit admits (``refold.services.api.rate_limits``).

:func:`admitted_from_memory` is the same check for a hand-dispatched route (the hot entity
read, ``refold.services.query.hot``): it answers only what memory can, and leaves everything else
(a key not cached, every refusal) to :func:`require`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.concurrency import run_in_threadpool

from refold.services.api.context import ServiceContext, get_context
from refold.services.api.errors import ApiError
from refold.services.auth.errors import ApiKeySpecError, ApiKeyStoreError
from refold.services.auth.journal import ApiKeyJournal, journal_topic
from refold.services.auth.keys import SCOPES, ApiKey, ApiKeyStore, Scope, parse_key

__all__ = ["VERIFY_CACHE_S", "admitted_from_memory", "api_key_store", "require"]

logger = logging.getLogger(__name__)

# How long a process trusts a key it has checked: bounds how late a revocation takes effect,
# and saves a Redis round trip on nearly every request of a busy client.
VERIFY_CACHE_S = 1.0
_HOW = "send `Authorization: Bearer <key>` or `X-API-Key: <key>` (keys: `refold keys add`)"

# Declared security schemes: /docs shows an "Authorize" button for each. auto_error=False so
# that the answer to a missing key is refold's 401 body, not FastAPI's.
_bearer = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="rfk_<id>_<secret>",
    description="An API key made with `refold keys add --scope ingest|query|admin`.",
    auto_error=False,
)
_api_key_header = APIKeyHeader(
    name="X-API-Key",
    scheme_name="apiKey",
    description="The same API key, in a header of its own.",
    auto_error=False,
)


def api_key_store(app: FastAPI, context: ServiceContext) -> ApiKeyStore:
    """The app's key store (made on first use; a new context gets a new store)."""
    current: tuple[ServiceContext, ApiKeyStore] | None = getattr(app.state, "api_keys", None)
    if current is None or current[0] is not context:
        store = ApiKeyStore(context.redis, context.key_prefix, cache_s=VERIFY_CACHE_S)
        current = (context, store)
        app.state.api_keys = current
    return current[1]


# An empty key store asks the journal at most this often per process (a stream of refused
# keys must not become a stream of topic reads).
_RESTORE_EVERY_S = 30.0


def _restore_once(app: FastAPI, context: ServiceContext) -> bool:
    """Fill an empty key store from the journal, at most every ``_RESTORE_EVERY_S``.

    Returns:
        Whether records were restored.

    Raises:
        ApiKeyStoreError: Redis or the journal failed.
    """
    last: float = getattr(app.state, "api_keys_restored_at", -_RESTORE_EVERY_S)
    if time.monotonic() - last < _RESTORE_EVERY_S:
        return False
    app.state.api_keys_restored_at = time.monotonic()
    journal = ApiKeyJournal(
        context.settings.kafka.as_librdkafka(), journal_topic(context.key_prefix)
    )
    return journal.restore(api_key_store(app, context)) > 0


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")


def _unauthenticated(message: str, *, invalid: bool) -> ApiError:
    challenge = 'Bearer realm="refold"' + (', error="invalid_token"' if invalid else "")
    return ApiError(401, "UNAUTHENTICATED", message, headers={"WWW-Authenticate": challenge})


def _presented(
    request: Request, bearer: HTTPAuthorizationCredentials | None, header: str | None
) -> str:
    if bearer is not None:
        return bearer.credentials
    if header:
        return header
    authorization = request.headers.get("Authorization")
    if authorization:
        scheme = authorization.split(" ", 1)[0]
        msg = f"the Authorization header uses the {scheme!r} scheme, not Bearer: {_HOW}"
        raise _unauthenticated(msg, invalid=True)
    msg = f"no API key: {_HOW}"
    raise _unauthenticated(msg, invalid=False)


def _rejected(key: ApiKey | None, now_ms: int, store_empty: bool = False) -> ApiError | None:
    if key is None and store_empty:
        msg = (
            "unknown API key: this deployment's key store holds no keys at all (its Redis "
            "restarted empty or was flushed?), so no key can be valid. Operator action: make "
            "keys again with `refold keys add`, and keep Redis persistent (the local stack's "
            "is: AOF under its state directory)"
        )
        return _unauthenticated(msg, invalid=True)
    if key is None:
        msg = "unknown API key: it was mistyped, or not made by this deployment's `refold keys`"
        return _unauthenticated(msg, invalid=True)
    status = key.status(now_ms)
    if status == "revoked":
        assert key.revoked_at is not None  # noqa: S101 - implied by the status
        msg = (
            f"this API key (id {key.id}, name {key.name!r}) was revoked at "
            f"{_when(key.revoked_at)}: ask for a new one"
        )
        return _unauthenticated(msg, invalid=True)
    if status == "expired":
        assert key.expires_at is not None  # noqa: S101 - implied by the status
        msg = (
            f"this API key (id {key.id}, name {key.name!r}) expired at "
            f"{_when(key.expires_at)}: ask for a new one"
        )
        return _unauthenticated(msg, invalid=True)
    return None


async def _count(context: ServiceContext, scope: Scope, key: ApiKey) -> None:
    """Count the request against its key's rate limit (429 over it).

    Most requests from this process's share, in memory; the next share taken on the loop
    (:class:`~refold.services.api.rate_limits.LoopShares`); the rest (a limit counted a
    request at a time, a key at its limit, no asyncio client) in Redis on a thread.
    """
    if scope == "admin":
        return
    limits = context.rate_limits()
    if limits.admit_from_share(scope, key.id):
        return
    shares = context.loop_shares()
    if shares is None:
        await run_in_threadpool(limits.check, scope, key.id)
    elif not await shares.admit(scope, key.id):
        await run_in_threadpool(limits.count_one, scope, key.id)


async def admitted_from_memory(
    app: FastAPI,
    context: ServiceContext,
    scope: Scope,
    authorization: str | None,
    api_key: str | None,
) -> bool:
    """Whether a request passes :func:`require` (``scope``) on what this process has in memory.

    ``authorization`` and ``api_key`` are the request's ``Authorization`` and ``X-API-Key``
    headers (None when absent). True: authentication is off, or the request's key is in the
    verification cache, active and with the scope; the request is then counted against its rate
    limit (which may answer 429). False: nothing was counted, and the caller must run
    :func:`require`'s dependency, which answers every other case (a key to look up in Redis,
    401, 403).
    """
    if context.settings.serve.auth == "off":
        return True
    if authorization:
        scheme, presented = get_authorization_scheme_param(authorization)
        if scheme.lower() != "bearer" or not presented:
            return False
    else:
        presented = api_key or ""
    store = api_key_store(app, context)
    key = store.cached(presented) if presented else None
    if key is None or key.status(store.now_ms()) != "active" or not key.allows(scope):
        return False
    await _count(context, scope, key)
    return True


def require(scope: Scope) -> Callable[..., Awaitable[ApiKey | None]]:
    """FastAPI dependency: the request carries a valid API key with ``scope`` (or ``admin``).

    Use it as ``dependencies=[Depends(require("query"))]``, or as a parameter to get the
    caller's key: ``key: Annotated[ApiKey | None, Depends(require("ingest"))]`` (None when
    authentication is off).

    Args:
        scope: ``ingest``, ``query`` or ``admin``.

    Returns:
        The dependency.

    Raises:
        ApiKeySpecError: ``scope`` is none of these (at import time of the route).
    """
    if scope not in SCOPES:
        msg = f"unknown scope {scope!r}: choose from {', '.join(SCOPES)}"
        raise ApiKeySpecError(msg)

    async def _require(
        request: Request,
        context: Annotated[ServiceContext, Depends(get_context)],
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        header: Annotated[str | None, Depends(_api_key_header)],
    ) -> ApiKey | None:
        if context.settings.serve.auth == "off":
            return None
        presented = _presented(request, bearer, header)
        store = api_key_store(request.app, context)
        key = store.cached(presented)
        empty = False
        if key is None:
            try:
                key = await run_in_threadpool(store.lookup, presented)
            except ApiKeyStoreError as exc:
                logger.error("API keys unavailable: %s", exc)
                msg = "API keys cannot be checked now (their store is unreachable): retry later"
                raise ApiError(503, "AUTH_UNAVAILABLE", msg, headers={"Retry-After": "1"}) from exc
            if key is None and parse_key(presented) is not None:
                # A well-formed key refused by an empty store (Redis restarted empty): fill the
                # store from the keys' journal and look again; if it stays empty, the 401
                # says so. Only a hint: a store that fails now leaves the plain 401.
                with contextlib.suppress(ApiKeyStoreError):
                    empty = await run_in_threadpool(store.empty)
                    if empty and await run_in_threadpool(_restore_once, request.app, context):
                        key = await run_in_threadpool(store.lookup, presented)
                        empty = key is None and await run_in_threadpool(store.empty)
        rejected = _rejected(key, store.now_ms(), empty)
        if rejected is not None:
            raise rejected
        assert key is not None  # noqa: S101 - _rejected refuses None
        if not key.allows(scope):
            msg = (
                f"this key (name {key.name!r}, id {key.id}) has scopes "
                f"[{', '.join(key.scopes)}]; this route needs {scope}"
            )
            challenge = f'Bearer realm="refold", error="insufficient_scope", scope="{scope}"'
            raise ApiError(
                403,
                "FORBIDDEN",
                msg,
                headers={"WWW-Authenticate": challenge},
                required_scope=scope,
                scopes=list(key.scopes),
            )
        await _count(context, scope, key)
        return key

    return _require
