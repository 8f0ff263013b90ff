"""One webhook delivery: the request, its classification, and the retry policy.

Pure except :class:`WebhookSender`, which owns the keep-alive HTTP client (``httpx.Client``,
shared by the dispatcher's threads: httpx documents it as safe to share between threads).

Classification of an attempt:

========================================================  =========  ===========================
outcome                                                   retried?   when attempts run out
========================================================  =========  ===========================
2xx                                                       delivered  -
408, 409, 425, 429, any 5xx                               yes        ``webhook-failed`` (DLQ)
timeouts, connection refused/reset, protocol errors       yes        ``webhook-failed`` (DLQ)
any other status (3xx: no redirects are followed, 4xx)    no         ``webhook-rejected`` (DLQ)
========================================================  =========  ===========================

409 is retried because receivers that implement idempotency keys (Stripe's convention) answer
409 while an earlier attempt with the same key is still being processed: our attempt timed out
but theirs did not. ``Retry-After`` (seconds or an HTTP date) raises the next backoff to it,
capped at the backoff maximum.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import orjson
from tenacity import (
    RetryCallState,
    Retrying,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)

__all__ = [
    "RETRIABLE_STATUSES",
    "USER_AGENT",
    "AttemptResult",
    "RetryPolicy",
    "WebhookSender",
    "is_retriable_exception",
    "is_retriable_status",
    "parse_retry_after",
    "payload_json",
    "sign",
]

USER_AGENT = "refold-webhooks/1"
# Statuses worth another attempt besides 5xx (see the module docstring).
RETRIABLE_STATUSES = frozenset({408, 409, 425, 429})


def is_retriable_status(status: int) -> bool:
    """True when a non-2xx answer may succeed later (5xx, 408, 409, 425, 429)."""
    return status >= 500 or status in RETRIABLE_STATUSES


def is_retriable_exception(exc: BaseException) -> bool:
    """True for transport failures that may pass: timeouts, refused or reset connections.

    Not for errors that would repeat exactly (a malformed URL, an unsupported scheme, a request
    httpx refuses to send): those dead-letter the insight at once.
    """
    if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return True
    return isinstance(exc, httpx.ProxyError)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or HTTP-date), if valid."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one attempt came to.

    Attributes:
        status: The HTTP status, or ``None`` when no answer came (``error`` says why).
        error: The exception's class and message, when the request failed.
        retriable: Worth another attempt (see the module docstring).
        retry_after_s: The receiver's ``Retry-After``, in seconds, if it sent one.
        latency_ms: How long the attempt took.
    """

    status: int | None
    error: str | None
    retriable: bool
    retry_after_s: float | None
    latency_ms: float

    @property
    def delivered(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        """``HTTP 503`` or the error, for logs and the ``refold.error`` header."""
        if self.status is not None:
            return f"HTTP {self.status}"
        return self.error or "no answer"


class RetryPolicy:
    """When to try again: tenacity's stop and wait strategies, applied per insight.

    The backoff before attempt ``n + 1`` is "equal jitter": with ``d = min(max_s, initial_s *
    2**(n - 1))``, a fixed ``d / 2`` (``wait_exponential``) plus a random share of up to
    ``d / 2`` (``wait_random_exponential``, full jitter). The fixed half gives the retry
    budget a floor, so an outage shorter than :meth:`budget_bounds` ``[0]`` never dead-letters
    anything; the random half spreads the retries of many insights apart.

    The policy is applied by the dispatcher's scheduler, which keeps one
    :class:`tenacity.RetryCallState` per insight and never sleeps in a worker thread: an insight
    waiting for its next attempt holds no connection and no thread.

    Args:
        max_attempts: Attempts before giving up (1: no retry).
        initial_s: See above.
        max_s: See above.
    """

    def __init__(self, max_attempts: int, initial_s: float, max_s: float) -> None:
        self.max_attempts = max_attempts
        self.initial_s = initial_s
        self.max_s = max_s
        self._stop = stop_after_attempt(max_attempts)
        self._wait = wait_exponential(multiplier=initial_s / 2, max=max_s / 2) + (
            wait_random_exponential(multiplier=initial_s / 2, max=max_s / 2)
        )
        self._retrying = Retrying(stop=self._stop, wait=self._wait)

    def new_state(self) -> RetryCallState:
        """The retry state of one insight (attempt 1 next)."""
        return RetryCallState(self._retrying, None, (), {})

    def next_delay(self, state: RetryCallState, result: AttemptResult) -> float | None:
        """Record ``result`` for the attempt ``state`` is at; the seconds until the next one.

        Returns:
            ``None`` when there is no next attempt (delivered, permanent, or out of attempts);
            otherwise the backoff, at least the receiver's ``Retry-After`` (capped at
            ``max_s``). ``state`` then counts the next attempt.
        """
        state.set_result(result)
        if result.delivered or not result.retriable or self._stop(state):
            return None
        delay = float(self._wait(state))
        if result.retry_after_s is not None:
            delay = max(delay, min(result.retry_after_s, self.max_s))
        state.prepare_for_next_attempt()
        return delay

    def window(self, attempt: int) -> tuple[float, float]:
        """Bounds of the backoff after attempt ``attempt`` (without ``Retry-After``)."""
        full = min(self.max_s, self.initial_s * 2 ** (attempt - 1))
        return full / 2, full

    def budget_bounds(self) -> tuple[float, float]:
        """Least and most time spent in backoff before an insight is dead-lettered."""
        windows = [self.window(n) for n in range(1, self.max_attempts)]
        return sum(low for low, _ in windows), sum(high for _, high in windows)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):  # Avro bytes and fixed: base64, as JSON has no bytes
        return base64.b64encode(value).decode()
    msg = f"{type(value).__name__} is not JSON serialisable"
    raise TypeError(msg)


def payload_json(payload: Mapping[str, Any]) -> bytes:
    """The request body: compact JSON, Avro ``bytes``/``fixed`` values as base64 strings."""
    return orjson.dumps(payload, default=_json_default)


def _signing_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :])
    return secret.encode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of Standard Webhooks: ``v1,<base64 HMAC-SHA256>``.

    The signed content is ``<message_id>.<timestamp>.<body>``; a receiver recomputes it with the
    shared secret and compares in constant time (and rejects old timestamps against replays).
    """
    content = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_signing_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookSender:
    """Makes attempts: one POST each, through one keep-alive client shared by all threads.

    Args:
        url: Where to POST.
        timeout_s: Whole-request timeout.
        connect_timeout_s: Connect timeout.
        connections: Keep-alive connections to keep (the dispatcher's concurrency).
        headers: Extra headers sent with every request.
        signing_secret: Signs every request (see :func:`sign`) when given.
        verify: TLS verification: ``True`` (system CAs) or an ``ssl.SSLContext``.
        transport: An httpx transport to use instead of the network (tests, benchmarks).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        connections: int,
        headers: Mapping[str, str] | None = None,
        signing_secret: str | None = None,
        verify: Any = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self._signing_secret = signing_secret
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            headers={"User-Agent": USER_AGENT, **dict(headers or {})},
            verify=verify,
            follow_redirects=False,  # a redirect is a misconfigured URL: rejected, not chased
            transport=transport,
        )

    def attempt(self, body: bytes, headers: Mapping[str, str], message_id: str) -> AttemptResult:
        """POST ``body`` once; classify the answer or the failure (never raises for those)."""
        sent = {"Content-Type": "application/json", **headers}
        if self._signing_secret is not None:
            timestamp = int(time.time())
            sent["webhook-id"] = message_id
            sent["webhook-timestamp"] = str(timestamp)
            sent["webhook-signature"] = sign(self._signing_secret, message_id, timestamp, body)
        started = time.perf_counter()
        try:
            response = self._client.post(self.url, content=body, headers=sent)
        except httpx.HTTPError as exc:
            latency = (time.perf_counter() - started) * 1000
            error = f"{type(exc).__name__}: {exc}"[:500]
            return AttemptResult(None, error, is_retriable_exception(exc), None, latency)
        latency = (time.perf_counter() - started) * 1000
        status = response.status_code
        retry_after = None
        if not 200 <= status < 300:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
        return AttemptResult(
            status,
            None,
            not 200 <= status < 300 and is_retriable_status(status),
            retry_after,
            latency,
        )

    def close(self) -> None:
        """Close the connections."""
        self._client.close()
