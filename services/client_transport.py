"""How :class:`~refold.services.client.RefoldClient` talks HTTP: URLs, parameters, answers.

Path segments, the consistency parameters of a query, the freshness of an answer, one request
with its answer decoded or its failure raised as a :class:`ClientError`, and the rule and wait
of ingest's retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import tenacity

from refold.services.client_errors import (
    IdempotencyConflictError,
    InvalidRequestError,
    ServerError,
    ServiceUnavailableError,
    UnreachableError,
    error_of,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Freshness",
    "consistency_params",
    "freshness_of",
    "path_segment",
    "retried",
    "retry_wait",
    "send",
]

# Seconds a request may take by default; a query that asks the server to wait (``wait_ms``)
# gets that wait on top, so a slow consistency wait is the server's 504, not a client timeout.
DEFAULT_TIMEOUT_S = 10.0
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


@dataclass
class Freshness:
    """Which generation answered, and its applied positions (every query's answer has them)."""

    processor: str
    generation: int
    positions: dict[str, int] = field(default_factory=dict)


def freshness_of(body: Mapping[str, Any]) -> Freshness:
    """The freshness fields of an answer's body."""
    return Freshness(
        str(body.get("processor", "")),
        int(body.get("generation", 0)),
        {str(k): int(v) for k, v in (body.get("positions") or {}).items()},
    )


def path_segment(value: str) -> str:
    """One path segment, every reserved character escaped (keys may hold ``/``, ``?``...)."""
    return quote(value, safe="")


def consistency_params(
    consistency_token: str | None,
    min_positions: Mapping[str, int] | None,
    wait_ms: int | None,
) -> dict[str, str]:
    """The query parameters of a read-your-writes wait (empty: answer at once)."""
    params: dict[str, str] = {}
    if consistency_token is not None:
        params["consistency_token"] = consistency_token
    if min_positions:
        params["min_positions"] = ",".join(f"{tp}:{o}" for tp, o in min_positions.items())
    if wait_ms is not None:
        params["wait_ms"] = str(wait_ms)
    return params


def retried(exc: BaseException) -> bool:
    """An ingest failure its retry with the same key may cure."""
    if isinstance(exc, IdempotencyConflictError):
        return exc.code == "IDEMPOTENCY_KEY_IN_USE"
    return isinstance(exc, ServiceUnavailableError | UnreachableError)


def retry_wait(state: tenacity.RetryCallState) -> float:
    """``Retry-After`` when the service gave one (at most 30 s), else 0.5 s, 1 s, 2 s... (5 s)."""
    exc = state.outcome.exception() if state.outcome is not None else None
    after = exc.retry_after if isinstance(exc, ServiceUnavailableError) else None
    if after is None and isinstance(exc, IdempotencyConflictError):
        after = 1.0
    if after is not None:
        return min(after, 30.0)
    return float(min(0.5 * 2 ** (state.attempt_number - 1), 5.0))


def send(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str],
    params: Mapping[str, str] | None = None,
    payload: Any = None,
    wait_ms: int | None = None,
    invalid: type[InvalidRequestError] = InvalidRequestError,
) -> tuple[dict[str, Any], httpx.Response]:
    """Send a request; the decoded JSON object of a 2xx answer, else its error raised.

    ``timeout`` is the client's; a query that asks the server to wait (``wait_ms``) gets that
    wait on top, so a slow consistency wait is the server's 504, not a client timeout.
    """
    timeout = timeout + (wait_ms or 0) / 1000
    try:
        response = http.request(
            method,
            url,
            params=params or None,
            content=None if payload is None else orjson.dumps(payload),
            headers={**_JSON, **headers},
            timeout=timeout,
        )
    except httpx.TimeoutException as exc:
        msg = f"{method} {url}: no answer within {timeout:g} s ({exc})"
        raise UnreachableError(msg, status=0, code="TIMEOUT") from exc
    except httpx.TransportError as exc:
        msg = f"{method} {url}: {str(exc) or type(exc).__name__}"
        raise UnreachableError(msg, status=0, code="UNREACHABLE") from exc
    if not response.is_success:
        raise error_of(response, invalid)
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        msg = f"{method} {url}: the answer is not JSON ({response.text[:200]!r})"
        raise ServerError(msg, status=response.status_code, code="NOT_JSON") from exc
    if not isinstance(body, dict):
        msg = f"{method} {url}: expected a JSON object, got {type(body).__name__}"
        raise ServerError(msg, status=response.status_code, code="NOT_AN_OBJECT", body=body)
    return body, response
