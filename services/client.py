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

from refold.services.client_errors import (
    ClientError,
    ConsistencyTimeoutError,
    ForbiddenError,
    GoneError,
    IdempotencyConflictError,
    InvalidEventsError,
    InvalidRequestError,
    NotAcknowledgedError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
    UnauthenticatedError,
    UnreachableError,
    error_of,
)
from refold.services.client_results import (
    Aggregate,
    Delivery,
    Entities,
    Entity,
    IngestResult,
    Page,
    Windows,
    delivery_of,
)

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
        deliveries = tuple(delivery_of(d) for d in body.get("deliveries", ()))
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
