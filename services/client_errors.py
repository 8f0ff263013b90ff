"""The errors of :class:`~refold.services.client.RefoldClient`, one class per kind of answer.

Each carries the server's ``code``, the HTTP ``status`` and the decoded ``body``;
:func:`error_of` maps a non-2xx answer to its class.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from refold.services.client_results import Delivery, delivery_of

__all__ = [
    "ClientError",
    "ConsistencyTimeoutError",
    "ForbiddenError",
    "GoneError",
    "IdempotencyConflictError",
    "InvalidEventsError",
    "InvalidRequestError",
    "NotAcknowledgedError",
    "NotFoundError",
    "ServerError",
    "ServiceUnavailableError",
    "UnauthenticatedError",
    "UnreachableError",
    "error_of",
]


class ClientError(Exception):
    """Root of the client's errors: a refused request, or no answer at all.

    (Not a ``RefoldError``: its ``code`` is the server's code of this one answer.)

    Attributes:
        status: HTTP status (0: no answer, see :class:`UnreachableError`).
        code: The server's error code (e.g. ``EVENT_INVALID``), or ``HTTP_<status>`` when the
            body was not refold's (a proxy's page).
        message: The server's message.
        body: The decoded body (``{"error": {...}}``), or its text when it was not JSON.
        headers: The answer's headers (empty without an answer).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        body: Any = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(f"[{code}] {message}" + (f" (HTTP {status})" if status else ""))
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        self.headers = headers if headers is not None else httpx.Headers()

    @property
    def details(self) -> dict[str, Any]:
        """The error object of the body (``{}`` when there is none)."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return dict(self.body["error"])
        return {}


class UnreachableError(ClientError):
    """No answer: connection refused or reset, DNS, TLS, or the client's timeout."""


class InvalidRequestError(ClientError):
    """400, 413 or 422: the request was refused as malformed or too large (split it).

    ``errors`` names the fields where the server names them.
    """

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The server's list of problems, each naming its field (``[]`` if none)."""
        errors = self.details.get("errors")
        return list(errors) if isinstance(errors, list) else []


class InvalidEventsError(InvalidRequestError):
    """422 on ingest: events do not meet their contracts; nothing of the request was sent.

    ``errors`` holds one entry per refused event, up to the server's ``max_reported_errors``:
    ``{"index", "type", "code", "fields", "problems"}``; :attr:`errors_omitted` counts the rest.
    """

    @property
    def errors_omitted(self) -> int:
        """Refused events beyond those described in ``errors``."""
        return int(self.details.get("errors_omitted", 0))


class UnauthenticatedError(ClientError):
    """401: no API key, or one that is unknown, revoked or expired."""


class ForbiddenError(ClientError):
    """403: the key lacks the scope the route needs."""


class NotFoundError(ClientError):
    """404: no such route, processor, table, entity, aggregate or generation."""


class GoneError(ClientError):
    """410: a scan's generation was removed (``replay gc``) while it ran: start it again."""


class ConsistencyTimeoutError(ClientError):
    """409 or 504: the live generation had not applied the token's positions in time.

    409: the request asked not to wait (``wait_ms=0``); 504: it waited in vain (the processor
    may be behind or stopped: see its lag).
    """

    @property
    def positions(self) -> dict[str, int]:
        """``"<topic>/<partition>"`` -> next offset the live generation had applied."""
        positions = self.details.get("positions")
        return dict(positions) if isinstance(positions, dict) else {}

    @property
    def missing(self) -> dict[str, int]:
        """The positions asked for that it had not reached yet."""
        missing = self.details.get("missing")
        return dict(missing) if isinstance(missing, dict) else {}

    @property
    def generation(self) -> int | None:
        """The live generation that was read."""
        generation = self.details.get("generation")
        return generation if isinstance(generation, int) else None


class ServiceUnavailableError(ClientError):
    """503: the service cannot answer now (broker, Redis); retry after ``retry_after``."""

    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked to wait (``Retry-After``), if it said so in seconds."""
        value = self.headers.get("Retry-After")
        try:
            return float(value) if value is not None else None
        except ValueError:  # an HTTP date: rare enough to leave to the caller's own backoff
            return None


class NotAcknowledgedError(ServiceUnavailableError):
    """503 on ingest: the broker did not acknowledge some events in time.

    The acknowledged ones are written and stay written; retrying the others may write one
    twice if it did land (see ``refold.services.errors.PublishError``).
    """

    @property
    def unacknowledged(self) -> list[dict[str, Any]]:
        """The events not acknowledged: ``{"index", "type", "error"}`` each, in request order."""
        items = self.details.get("unacknowledged")
        return list(items) if isinstance(items, list) else []

    @property
    def deliveries(self) -> tuple[Delivery | None, ...]:
        """Per event of the request: where it was written, or None if not acknowledged."""
        items = self.details.get("deliveries")
        if not isinstance(items, list):
            return ()
        return tuple(None if d is None else delivery_of(d) for d in items)

    @property
    def consistency_token(self) -> str | None:
        """A token covering the acknowledged events (to read them while retrying the rest)."""
        token = self.details.get("consistency_token")
        return token if isinstance(token, str) else None


class ServerError(ClientError):
    """Any other 5xx: a failure of the service (its logs say more)."""


class IdempotencyConflictError(ClientError):
    """409 on ingest: the ``Idempotency-Key`` is taken.

    ``IDEMPOTENCY_KEY_REUSED``: it was used for other events (use a new key for new events);
    ``IDEMPOTENCY_KEY_IN_USE``: a request with it still runs (:meth:`RefoldClient.ingest`
    retries that).
    """


def error_of(response: httpx.Response, invalid: type[InvalidRequestError]) -> ClientError:
    """The error of a non-2xx answer."""
    status = response.status_code
    try:
        body: Any = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        code, message = str(error["code"]), str(error.get("message", ""))
    else:
        code, message = f"HTTP_{status}", (response.text[:200] or response.reason_phrase)
    cls: type[ClientError]
    if status in (400, 422):
        cls = invalid
    elif status == 413:
        cls = InvalidRequestError
    elif status == 401:
        cls = UnauthenticatedError
    elif status == 403:
        cls = ForbiddenError
    elif status == 404:
        cls = NotFoundError
    elif status == 410:
        cls = GoneError
    elif status in (409, 504) and isinstance(error, dict) and "positions" in error:
        cls = ConsistencyTimeoutError
    elif status == 409 and code.startswith("IDEMPOTENCY_KEY_"):
        cls = IdempotencyConflictError
    elif status == 503:
        cls = NotAcknowledgedError if code == "PUBLISH_FAILED" else ServiceUnavailableError
    elif status >= 500:
        cls = ServerError
    else:
        cls = ClientError
    return cls(message, status=status, code=code, body=body, headers=response.headers)
