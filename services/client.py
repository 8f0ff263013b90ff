"""A small typed Python client of refold's HTTP services: ingest and query, on httpx.

For downstream apps that would rather speak HTTP than Kafka and Redis::

    from refold.services.client import RefoldClient

    with RefoldClient("http://127.0.0.1:8000", api_key="rfk_...") as refold:
        written = refold.ingest([("OrderPlaced", {"order_id": "o-1", ...})])
        order = refold.entity(
            "order_state", "orders", "o-1", consistency_token=written.consistency_token
        )
        print(order.value, order.generation, order.positions)

Every failure raises a :class:`ClientError` subclass carrying the server's ``code``, the HTTP
``status`` and the decoded ``body`` (see the class list below). Only ingest is retried: each
request carries an ``Idempotency-Key`` (the caller's, or a new one), and a 503, no answer at
all, or 409 ``IDEMPOTENCY_KEY_IN_USE`` is retried with the same key (``attempts``, default 3),
so the service produces what the first attempt did not, and nothing twice. Queries are not
retried.

Lifecycle: one client per process is enough; its ``httpx.Client`` pools connections and may be
shared between threads. Close it (or use it as a context manager) when done; a client given
in ``http_client`` is left open for its owner.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import tenacity

__all__ = [
    "Aggregate",
    "ClientError",
    "ConsistencyTimeoutError",
    "Delivery",
    "Entities",
    "Entity",
    "ForbiddenError",
    "GoneError",
    "IdempotencyConflictError",
    "IngestResult",
    "InvalidEventsError",
    "InvalidRequestError",
    "NotAcknowledgedError",
    "NotFoundError",
    "Page",
    "RefoldClient",
    "ServerError",
    "ServiceUnavailableError",
    "UnauthenticatedError",
    "UnreachableError",
    "Windows",
]

# Seconds a request may take by default; a query that asks the server to wait (``wait_ms``)
# gets that wait on top, so a slow consistency wait is the server's 504, not a client timeout.
_DEFAULT_TIMEOUT_S = 10.0
_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where the broker wrote one ingested event."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class IngestResult:
    """The answer to an ingest request.

    Attributes:
        accepted: Events written (all of the request's).
        deliveries: Where each was written, in request order.
        consistency_token: Pass it to a query to read these writes (``consistency_token=``).
        idempotency_key: The request's ``Idempotency-Key`` (send it again to retry it).
        replayed: The answer is the one recorded for an earlier request with this key: that
            request produced the events, this one produced nothing.
    """

    accepted: int
    deliveries: tuple[Delivery, ...]
    consistency_token: str
    idempotency_key: str = ""
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Entity:
    """One entity's state, and how fresh it is.

    Attributes:
        key: The entity's key.
        value: Its state (decoded JSON).
        processor: The processor that holds it.
        generation: The generation it was read from (never a mix of two).
        positions: What that generation had applied: ``"<topic>/<partition>"`` -> next offset.
        etag: The response's ETag (None if the server sent none).
    """

    key: str
    value: Any
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Entities:
    """A batch get: each key's state, or None where the table has no such entity."""

    values: Mapping[str, Any]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan; ``next_cursor`` is None on the last page."""

    items: tuple[tuple[str, Any], ...]
    next_cursor: str | None
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Aggregate:
    """An aggregate's counters."""

    name: str
    counters: Mapping[str, int]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows of one group ending in a time range, oldest first.

    Attributes:
        window: The window's name.
        group: The group.
        results: One result per window with data: ``start``, ``end``, ``count``, and per
            measure ``sum:``, ``min:``, ``max:``, ``avg:``, ``distinct:`` (as the processor
            emits it when the window closes).
    """

    window: str
    group: str
    results: tuple[Mapping[str, Any], ...]
    processor: str
    generation: int
    positions: Mapping[str, int]
    etag: str | None


# --- errors -----------------------------------------------------------------------------------


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
        return tuple(None if d is None else _delivery(d) for d in items)

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


def _retried(exc: BaseException) -> bool:
    """An ingest failure its retry with the same key may cure."""
    if isinstance(exc, IdempotencyConflictError):
        return exc.code == "IDEMPOTENCY_KEY_IN_USE"
    return isinstance(exc, ServiceUnavailableError | UnreachableError)


def _retry_wait(state: tenacity.RetryCallState) -> float:
    """``Retry-After`` when the service gave one (at most 30 s), else 0.5 s, 1 s, 2 s... (5 s)."""
    exc = state.outcome.exception() if state.outcome is not None else None
    after = exc.retry_after if isinstance(exc, ServiceUnavailableError) else None
    if after is None and isinstance(exc, IdempotencyConflictError):
        after = 1.0
    if after is not None:
        return min(after, 30.0)
    return float(min(0.5 * 2 ** (state.attempt_number - 1), 5.0))


def _error(response: httpx.Response, invalid: type[InvalidRequestError]) -> ClientError:
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


# --- the client -------------------------------------------------------------------------------


@dataclass
class _Freshness:
    processor: str
    generation: int
    positions: dict[str, int] = field(default_factory=dict)


def _freshness(body: Mapping[str, Any]) -> _Freshness:
    return _Freshness(
        str(body.get("processor", "")),
        int(body.get("generation", 0)),
        {str(k): int(v) for k, v in (body.get("positions") or {}).items()},
    )


def _delivery(item: Mapping[str, Any]) -> Delivery:
    return Delivery(str(item["topic"]), int(item["partition"]), int(item["offset"]))


def _segment(value: str) -> str:
    """One path segment, every reserved character escaped (keys may hold ``/``, ``?``...)."""
    return quote(value, safe="")


def _consistency(
    consistency_token: str | None,
    min_positions: Mapping[str, int] | None,
    wait_ms: int | None,
) -> dict[str, str]:
    params: dict[str, str] = {}
    if consistency_token is not None:
        params["consistency_token"] = consistency_token
    if min_positions:
        params["min_positions"] = ",".join(f"{tp}:{o}" for tp, o in min_positions.items())
    if wait_ms is not None:
        params["wait_ms"] = str(wait_ms)
    return params


class RefoldClient:
    """Ingest events into refold and read the state its processors keep, over HTTP.

    Args:
        base_url: The service, e.g. ``https://refold.example.com`` (without ``/v1``).
        api_key: An API key (``refold keys add``), sent as ``Authorization: Bearer``.
        timeout: Seconds a request may take (a consistency wait is added on top).
        transport: An httpx transport (tests: ``httpx.MockTransport``, or an ASGI app's).
        http_client: An ``httpx.Client`` to use instead of making one (it is not closed).
        headers: Extra headers on every request.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = _DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = dict(headers or {})
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=timeout)

    def __enter__(self) -> RefoldClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (unless the ``httpx.Client`` was given)."""
        if self._owns_http:
            self._http.close()

    # --- ingest --------------------------------------------------------------------------------

    def ingest(
        self,
        events: Iterable[tuple[str, Mapping[str, Any]]],
        *,
        idempotency_key: str | None = None,
        attempts: int = 3,
    ) -> IngestResult:
        """Send events, each ``(record name, fields)``; all are validated before any is sent.

        The request is retried with the same ``Idempotency-Key`` when the service answers 503,
        does not answer, or still runs an earlier attempt: what an attempt wrote is not written
        again (see ``refold.services.ingest.idempotency`` for the one case it cannot know).

        Args:
            events: E.g. ``[("OrderPlaced", {"order_id": "o-1", ...})]``.
            idempotency_key: The request's key (1-255 printable characters); default a new
                UUID. Give your own to retry across processes (store it with the events).
            attempts: Tries in all (1: no retry). Waits ``Retry-After``, else 0.5 s, 1 s...

        Returns:
            Where each was written, and the consistency token of the whole request.

        Raises:
            InvalidEventsError: Some event breaks its contract (``errors`` names every field);
                nothing was sent.
            NotAcknowledgedError: After the last attempt, the broker had still not acknowledged
                some events (``unacknowledged``, ``retry_after``); the others are written.
            IdempotencyConflictError: The key was used for other events.
            UnauthenticatedError: No valid key.
            ForbiddenError: The key lacks the ``ingest`` scope.
            ClientError: Any other failure.
        """
        payload = {"events": [{"type": t, "event": dict(e)} for t, e in events]}
        key = idempotency_key or uuid.uuid4().hex
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(max(1, attempts)),
            retry=tenacity.retry_if_exception(_retried),
            wait=_retry_wait,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                body, response = self._call(
                    "POST",
                    "/v1/events",
                    payload=payload,
                    invalid=InvalidEventsError,
                    headers={"Idempotency-Key": key},
                )
        deliveries = tuple(_delivery(d) for d in body.get("deliveries", ()))
        return IngestResult(
            int(body.get("accepted", len(deliveries))),
            deliveries,
            str(body.get("consistency_token", "")),
            key,
            response.headers.get("Idempotent-Replayed") == "true",
        )

    # --- query ---------------------------------------------------------------------------------

    def entity(
        self,
        processor: str,
        table: str,
        key: str,
        *,
        consistency_token: str | None = None,
        min_positions: Mapping[str, int] | None = None,
        wait_ms: int | None = None,
    ) -> Entity:
        """One entity's state, read from the live generation.

        Args:
            processor: E.g. ``order_state``.
            table: One of its tables, e.g. ``orders``.
            key: The entity's key.
            consistency_token: From :meth:`ingest`: answer only once the live generation has
                applied those writes (read your writes).
            min_positions: The same, explicitly: ``{"<topic>/<partition>": offset}``.
            wait_ms: How long the server may wait for them (its default otherwise).

        Raises:
            NotFoundError: No such processor, table or entity.
            ConsistencyTimeoutError: The writes were not applied in time (``positions``).
            ClientError: Any other failure.
        """
        path = (
            f"/v1/processors/{_segment(processor)}/tables/{_segment(table)}"
            f"/entities/{_segment(key)}"
        )
        params = _consistency(consistency_token, min_positions, wait_ms)
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = _freshness(body)
        return Entity(
            str(body.get("key", key)),
            body.get("value"),
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

    def entities(
        self,
        processor: str,
        table: str,
        keys: Sequence[str],
        *,
        consistency_token: str | None = None,
        min_positions: Mapping[str, int] | None = None,
        wait_ms: int | None = None,
    ) -> Entities:
        """Several entities' states at once, all from one generation (None: no such entity).

        Raises:
            InvalidRequestError: Too many keys (the server's ``max_batch_keys``).
            NotFoundError: No such processor or table.
            ConsistencyTimeoutError: The writes were not applied in time.
            ClientError: Any other failure.
        """
        path = f"/v1/processors/{_segment(processor)}/tables/{_segment(table)}/entities:batch-get"
        params = _consistency(consistency_token, min_positions, wait_ms)
        body, response = self._call(
            "POST", path, params=params, payload={"keys": list(keys)}, wait_ms=wait_ms
        )
        fresh = _freshness(body)
        return Entities(
            dict(body.get("values") or {}),
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

    def page(
        self,
        processor: str,
        table: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        consistency_token: str | None = None,
        min_positions: Mapping[str, int] | None = None,
        wait_ms: int | None = None,
    ) -> Page:
        """One page of a table's entities (start without ``cursor``; follow ``next_cursor``).

        A scan stays on the generation of its first page; the consistency arguments apply to
        that first page (the server ignores them with a cursor).

        Raises:
            NotFoundError: No such processor or table.
            InvalidRequestError: A damaged cursor, or one of another table.
            ConsistencyTimeoutError: The writes were not applied in time.
            ClientError: Any other failure.
        """
        path = f"/v1/processors/{_segment(processor)}/tables/{_segment(table)}/entities"
        params = _consistency(consistency_token, min_positions, wait_ms)
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = _freshness(body)
        items = tuple((str(item["key"]), item.get("value")) for item in body.get("items", ()))
        next_cursor = body.get("next_cursor")
        return Page(
            items,
            str(next_cursor) if next_cursor else None,
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

    def scan_pages(
        self,
        processor: str,
        table: str,
        page_size: int | None = None,
        *,
        consistency_token: str | None = None,
        wait_ms: int | None = None,
    ) -> Iterator[Page]:
        """Every page of a table, following the cursors (lazy: one request per page)."""
        page = self.page(
            processor,
            table,
            limit=page_size,
            consistency_token=consistency_token,
            wait_ms=wait_ms,
        )
        yield page
        while page.next_cursor is not None:
            page = self.page(processor, table, limit=page_size, cursor=page.next_cursor)
            yield page

    def scan(
        self,
        processor: str,
        table: str,
        page_size: int | None = None,
        *,
        consistency_token: str | None = None,
        wait_ms: int | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """Every ``(key, value)`` of a table, page by page (lazy), all from one generation.

        The scan stays on the generation of its first page even if a replay makes another live
        meanwhile; :class:`GoneError` if that generation is garbage-collected (start again).

        Args:
            processor: E.g. ``order_state``.
            table: One of its tables.
            page_size: Entities per request (the server's default otherwise).
            consistency_token: Start once these writes are applied (see :meth:`entity`).
            wait_ms: How long the server may wait for them.
        """
        for page in self.scan_pages(
            processor, table, page_size, consistency_token=consistency_token, wait_ms=wait_ms
        ):
            yield from page.items

    def aggregate(
        self,
        processor: str,
        name: str,
        *,
        consistency_token: str | None = None,
        min_positions: Mapping[str, int] | None = None,
        wait_ms: int | None = None,
    ) -> Aggregate:
        """An aggregate's counters, e.g. ``aggregate("order_state", "order_counts")``.

        Raises:
            NotFoundError: No such processor or aggregate.
            ConsistencyTimeoutError: The writes were not applied in time.
            ClientError: Any other failure.
        """
        path = f"/v1/processors/{_segment(processor)}/aggregates/{_segment(name)}"
        params = _consistency(consistency_token, min_positions, wait_ms)
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = _freshness(body)
        return Aggregate(
            name,
            {str(k): int(v) for k, v in (body.get("counters") or {}).items()},
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

    def window_groups(self, processor: str, window: str) -> tuple[str, ...]:
        """The groups that have data in ``window`` (of the live generation).

        Raises:
            NotFoundError: No such processor or window.
            ClientError: Any other failure.
        """
        path = f"/v1/processors/{_segment(processor)}/windows/{_segment(window)}/groups"
        body, _ = self._call("GET", path)
        return tuple(str(g) for g in body.get("groups") or ())

    def windows(
        self,
        processor: str,
        window: str,
        group: str,
        start: int,
        end: int,
        *,
        consistency_token: str | None = None,
        min_positions: Mapping[str, int] | None = None,
        wait_ms: int | None = None,
    ) -> Windows:
        """Every window of ``group`` ending in ``(start, end]`` (epoch ms) that has data.

        Raises:
            NotFoundError: No such processor or window.
            InvalidRequestError: A range wider than the server reads at once.
            ConsistencyTimeoutError: The writes were not applied in time.
            ClientError: Any other failure.
        """
        path = (
            f"/v1/processors/{_segment(processor)}/windows/{_segment(window)}"
            f"/groups/{_segment(group)}"
        )
        params = _consistency(consistency_token, min_positions, wait_ms)
        params.update(start=str(start), end=str(end))
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = _freshness(body)
        return Windows(
            window,
            group,
            tuple(dict(r) for r in body.get("results") or ()),
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

    # --- transport -----------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        payload: Any = None,
        wait_ms: int | None = None,
        invalid: type[InvalidRequestError] = InvalidRequestError,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, Any], httpx.Response]:
        """Send a request; the decoded JSON object of a 2xx answer, else its error raised."""
        url = f"{self.base_url}{path}"
        timeout = self.timeout + (wait_ms or 0) / 1000
        try:
            response = self._http.request(
                method,
                url,
                params=params or None,
                content=None if payload is None else orjson.dumps(payload),
                headers={**_JSON, **self._headers, **(headers or {})},
                timeout=timeout,
            )
        except httpx.TimeoutException as exc:
            msg = f"{method} {url}: no answer within {timeout:g} s ({exc})"
            raise UnreachableError(msg, status=0, code="TIMEOUT") from exc
        except httpx.TransportError as exc:
            msg = f"{method} {url}: {str(exc) or type(exc).__name__}"
            raise UnreachableError(msg, status=0, code="UNREACHABLE") from exc
        if not response.is_success:
            raise _error(response, invalid)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            msg = f"{method} {url}: the answer is not JSON ({response.text[:200]!r})"
            raise ServerError(msg, status=response.status_code, code="NOT_JSON") from exc
        if not isinstance(body, dict):
            msg = f"{method} {url}: expected a JSON object, got {type(body).__name__}"
            raise ServerError(msg, status=response.status_code, code="NOT_AN_OBJECT", body=body)
        return body, response
