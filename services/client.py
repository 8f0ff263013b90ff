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
in ``http_client`` is left open for its owner. How it talks HTTP (URLs, parameters, the
request, the retry rule): :mod:`refold.services.client_transport`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
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
from refold.services.client_transport import (
    DEFAULT_TIMEOUT_S,
    consistency_params,
    freshness_of,
    path_segment,
    retried,
    retry_wait,
    send,
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
        timeout: float = DEFAULT_TIMEOUT_S,
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
            retry=tenacity.retry_if_exception(retried),
            wait=retry_wait,
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
            f"/v1/processors/{path_segment(processor)}/tables/{path_segment(table)}"
            f"/entities/{path_segment(key)}"
        )
        params = consistency_params(consistency_token, min_positions, wait_ms)
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = freshness_of(body)
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
        path = (
            f"/v1/processors/{path_segment(processor)}/tables/{path_segment(table)}"
            "/entities:batch-get"
        )
        params = consistency_params(consistency_token, min_positions, wait_ms)
        body, response = self._call(
            "POST", path, params=params, payload={"keys": list(keys)}, wait_ms=wait_ms
        )
        fresh = freshness_of(body)
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
        path = f"/v1/processors/{path_segment(processor)}/tables/{path_segment(table)}/entities"
        params = consistency_params(consistency_token, min_positions, wait_ms)
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = freshness_of(body)
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
        path = f"/v1/processors/{path_segment(processor)}/aggregates/{path_segment(name)}"
        params = consistency_params(consistency_token, min_positions, wait_ms)
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = freshness_of(body)
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
        path = f"/v1/processors/{path_segment(processor)}/windows/{path_segment(window)}/groups"
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
            f"/v1/processors/{path_segment(processor)}/windows/{path_segment(window)}"
            f"/groups/{path_segment(group)}"
        )
        params = consistency_params(consistency_token, min_positions, wait_ms)
        params.update(start=str(start), end=str(end))
        body, response = self._call("GET", path, params=params, wait_ms=wait_ms)
        fresh = freshness_of(body)
        return Windows(
            window,
            group,
            tuple(dict(r) for r in body.get("results") or ()),
            fresh.processor,
            fresh.generation,
            fresh.positions,
            response.headers.get("ETag"),
        )

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
        """Send a request to the service (:func:`~refold.services.client_transport.send`)."""
        return send(
            self._http,
            method,
            f"{self.base_url}{path}",
            timeout=self.timeout,
            headers={**self._headers, **(headers or {})},
            params=params,
            payload=payload,
            wait_ms=wait_ms,
            invalid=invalid,
        )
