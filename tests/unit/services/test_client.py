"""The HTTP client on a mock transport: the requests it sends, answers it parses, errors it maps."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from refold.services.client import (
    Aggregate,
    ClientError,
    ConsistencyTimeoutError,
    Delivery,
    Entities,
    Entity,
    ForbiddenError,
    GoneError,
    IdempotencyConflictError,
    IngestResult,
    InvalidEventsError,
    InvalidRequestError,
    NotAcknowledgedError,
    NotFoundError,
    RefoldClient,
    ServerError,
    ServiceUnavailableError,
    UnauthenticatedError,
    UnreachableError,
    Windows,
)

TOKEN = "v1.tok"  # noqa: S105 - a consistency token (opaque to the client), no secret
FRESH = {"processor": "order_state", "generation": 3, "positions": {"orders/0": 12, "orders/1": 7}}


class _Server:
    """A mock transport that records requests and answers with ``handler``."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self.requests: list[httpx.Request] = []
        self.handler = handler

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.handler(request)

    def client(self, api_key: str | None = "rfk_k") -> RefoldClient:
        return RefoldClient(
            "http://refold.test/", api_key, transport=httpx.MockTransport(self), timeout=2.0
        )


def _answer(status: int, body: Any, headers: dict[str, str] | None = None) -> _Server:
    return _Server(lambda _request: httpx.Response(status, json=body, headers=headers))


def _error(code: str, message: str = "m", **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


def test_ingest_sends_events_and_parses_deliveries():
    server = _answer(
        200,
        {
            "accepted": 2,
            "deliveries": [
                {"topic": "orders", "partition": 1, "offset": 40},
                {"topic": "orders", "partition": 0, "offset": 9},
            ],
            "consistency_token": "v1.abc",
        },
    )
    with server.client() as client:
        result = client.ingest([("OrderPlaced", {"order_id": "o-1"}), ("OrderPaid", {"n": 1})])
    (request,) = server.requests
    assert result == IngestResult(
        2,
        (Delivery("orders", 1, 40), Delivery("orders", 0, 9)),
        "v1.abc",
        request.headers["Idempotency-Key"],  # a new key for each call without one
    )
    assert (request.method, str(request.url)) == ("POST", "http://refold.test/v1/events")
    assert request.headers["Authorization"] == "Bearer rfk_k"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "events": [
            {"type": "OrderPlaced", "event": {"order_id": "o-1"}},
            {"type": "OrderPaid", "event": {"n": 1}},
        ]
    }


def test_no_api_key_no_authorization_header():
    server = _answer(200, {"accepted": 0, "deliveries": [], "consistency_token": "v1.e30"})
    server.client(api_key=None).ingest([])
    assert "Authorization" not in server.requests[0].headers


def test_entity_escapes_the_path_and_passes_the_consistency_parameters():
    server = _answer(200, {**FRESH, "key": "a/b c?", "value": {"status": "paid"}}, {"ETag": '"g3"'})
    entity = server.client().entity(
        "order_state",
        "orders",
        "a/b c?",
        consistency_token=TOKEN,
        min_positions={"orders/0": 12},
        wait_ms=1500,
    )
    assert entity == Entity(
        "a/b c?", {"status": "paid"}, "order_state", 3, {"orders/0": 12, "orders/1": 7}, '"g3"'
    )
    (request,) = server.requests
    assert request.url.raw_path.decode() == (
        "/v1/processors/order_state/tables/orders/entities/a%2Fb%20c%3F"
        "?consistency_token=v1.tok&min_positions=orders%2F0%3A12&wait_ms=1500"
    )
    # The server may wait wait_ms: the client's timeout is extended by it.
    assert request.extensions["timeout"]["read"] == pytest.approx(3.5)


def test_batch_get_posts_the_keys():
    server = _answer(200, {**FRESH, "values": {"a": {"n": 1}, "b": None}})
    result = server.client().entities("order_state", "orders", ["a", "b"])
    assert result == Entities(
        {"a": {"n": 1}, "b": None}, "order_state", 3, FRESH["positions"], None
    )
    (request,) = server.requests
    assert request.url.path == "/v1/processors/order_state/tables/orders/entities:batch-get"
    assert json.loads(request.content) == {"keys": ["a", "b"]}


def test_scan_follows_the_cursor_to_the_end():
    pages = {
        None: {
            **FRESH,
            "items": [{"key": "a", "value": 1}, {"key": "b", "value": 2}],
            "next_cursor": "c1",
        },
        "c1": {**FRESH, "items": [{"key": "c", "value": 3}], "next_cursor": "c2"},
        "c2": {**FRESH, "items": [], "next_cursor": None},
    }
    server = _Server(
        lambda request: httpx.Response(200, json=pages[request.url.params.get("cursor")])
    )
    assert list(server.client().scan("order_state", "orders", page_size=2)) == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
    ]
    assert [r.url.params.get("cursor") for r in server.requests] == [None, "c1", "c2"]
    assert {r.url.params["limit"] for r in server.requests} == {"2"}
    # The consistency arguments go with the first page only (the cursor pins the generation).
    list(server.client().scan("order_state", "orders", consistency_token=TOKEN, wait_ms=100))
    assert [r.url.params.get("consistency_token") for r in server.requests[3:]] == [
        TOKEN,
        None,
        None,
    ]


def test_scan_is_lazy():
    server = _answer(200, {**FRESH, "items": [{"key": "a", "value": 1}], "next_cursor": "more"})
    items = server.client().scan("order_state", "orders")
    assert server.requests == []
    assert next(items) == ("a", 1)
    assert len(server.requests) == 1
    assert "limit" not in server.requests[0].url.params  # the server's default


def test_windows_and_groups():
    results = [{"start": 0, "end": 60_000, "count": 2, "sum:amount": 30}]
    server = _answer(200, {**FRESH, "window": "w1m", "group": "EUR", "results": results})
    client = server.client()
    got = client.windows("sales", "w1m", "EUR", 0, 120_000, consistency_token=TOKEN)
    assert got == Windows("w1m", "EUR", tuple(results), "order_state", 3, FRESH["positions"], None)
    request = server.requests[0]
    assert request.url.path == "/v1/processors/sales/windows/w1m/groups/EUR"
    assert dict(request.url.params) == {"consistency_token": TOKEN, "start": "0", "end": "120000"}
    server.handler = lambda _r: httpx.Response(200, json={**FRESH, "groups": ["EUR", "USD"]})
    assert client.window_groups("sales", "w1m") == ("EUR", "USD")
    assert server.requests[1].url.path == "/v1/processors/sales/windows/w1m/groups"


def test_aggregate():
    server = _answer(200, {**FRESH, "counters": {"placed": 5, "paid": 3}})
    result = server.client().aggregate("order_state", "order_counts")
    assert result == Aggregate(
        "order_counts", {"placed": 5, "paid": 3}, "order_state", 3, FRESH["positions"], None
    )
    assert server.requests[0].url.path == "/v1/processors/order_state/aggregates/order_counts"


@pytest.mark.parametrize(
    ("status", "body", "headers", "error_class"),
    [
        (
            401,
            _error("UNAUTHENTICATED", "no API key"),
            {"WWW-Authenticate": "Bearer"},
            UnauthenticatedError,
        ),
        (403, _error("FORBIDDEN", "needs ingest"), None, ForbiddenError),
        (404, _error("PROCESSOR_UNKNOWN"), None, NotFoundError),
        (404, _error("NOT_FOUND"), None, NotFoundError),
        (
            422,
            _error("REQUEST_INVALID", errors=[{"field": "query.limit"}]),
            None,
            InvalidRequestError,
        ),
        (400, _error("CONSISTENCY_TOKEN_INVALID"), None, InvalidRequestError),
        (409, _error("NOT_CONSISTENT", positions={"orders/0": 3}), None, ConsistencyTimeoutError),
        (
            504,
            _error("CONSISTENCY_TIMEOUT", positions={"orders/0": 3}),
            None,
            ConsistencyTimeoutError,
        ),
        (504, _error("GATEWAY"), None, ServerError),
        (410, _error("SCAN_GONE"), None, GoneError),
        (413, _error("TOO_MANY_KEYS"), None, InvalidRequestError),
        (503, _error("OFFSETS_UNAVAILABLE"), {"Retry-After": "2"}, ServiceUnavailableError),
        (500, _error("REFOLD_ERROR"), None, ServerError),
        (418, _error("TEAPOT"), None, ClientError),
    ],
)
def test_errors_map_to_types(status, body, headers, error_class):
    server = _answer(status, body, headers)
    with pytest.raises(ClientError) as info:
        server.client().entity("p", "t", "k")
    error = info.value
    assert type(error) is error_class
    assert (error.status, error.code, error.body) == (status, body["error"]["code"], body)
    assert error.message == body["error"]["message"]
    assert f"[{error.code}]" in str(error)


@pytest.mark.parametrize(
    ("status", "code"), [(409, "CONSISTENCY_NOT_MET"), (504, "CONSISTENCY_TIMEOUT")]
)
def test_consistency_timeout_carries_the_positions(status, code):
    server = _answer(status, _error(code, **FRESH, missing={"orders/0": 20}))
    with pytest.raises(ConsistencyTimeoutError) as info:
        server.client().entity("p", "t", "k", consistency_token=TOKEN, wait_ms=0)
    assert info.value.positions == FRESH["positions"]
    assert info.value.missing == {"orders/0": 20}
    assert info.value.generation == 3
    assert info.value.status == status


def test_invalid_events_name_their_fields():
    errors = [
        {"index": 0, "type": "OrderPlaced", "field": "amount", "message": "not a long"},
        {"index": 2, "type": "Nope", "field": "type", "message": "unknown event type"},
    ]
    server = _answer(422, _error("EVENT_INVALID", "2 events are invalid", errors=errors))
    with pytest.raises(InvalidEventsError) as info:
        server.client().ingest([("OrderPlaced", {}), ("OrderPaid", {}), ("Nope", {})])
    assert info.value.errors == errors
    assert isinstance(info.value, InvalidRequestError)


def test_not_acknowledged_carries_the_events_and_retry_after():
    unacknowledged = [{"index": 1, "type": "OrderPaid", "error": "Local: Message timed out"}]
    server = _answer(
        503,
        _error(
            "PUBLISH_FAILED",
            "1 of 2 not acknowledged",
            unacknowledged=unacknowledged,
            deliveries=[{"topic": "orders", "partition": 2, "offset": 5}, None],
            consistency_token=TOKEN,
        ),
        {"Retry-After": "5"},
    )
    with pytest.raises(NotAcknowledgedError) as info:
        server.client().ingest([("OrderPlaced", {}), ("OrderPaid", {})], attempts=1)
    error = info.value
    assert error.unacknowledged == unacknowledged
    assert error.deliveries == (Delivery("orders", 2, 5), None)
    assert error.consistency_token == TOKEN
    assert error.retry_after == 5.0
    assert isinstance(error, ServiceUnavailableError)


def test_ingest_is_retried_with_the_same_key_until_it_is_answered():
    answers = iter(
        [
            httpx.Response(503, json=_error("PUBLISH_FAILED"), headers={"Retry-After": "0"}),
            httpx.Response(409, json=_error("IDEMPOTENCY_KEY_IN_USE")),
            httpx.Response(503, json=_error("INGEST_BUSY"), headers={"Retry-After": "0"}),
            httpx.Response(
                200,
                json={"accepted": 1, "deliveries": [], "consistency_token": TOKEN},
                headers={"Idempotent-Replayed": "true"},
            ),
        ]
    )
    server = _Server(lambda _request: next(answers))
    with server.client() as client:
        result = client.ingest([("OrderPlaced", {})], idempotency_key="k-1", attempts=4)
    assert [r.headers["Idempotency-Key"] for r in server.requests] == ["k-1"] * 4
    assert (result.idempotency_key, result.replayed) == ("k-1", True)


def test_ingest_gives_up_after_its_attempts_and_never_retries_a_refusal():
    server = _answer(503, _error("PUBLISH_FAILED"), {"Retry-After": "0"})
    with pytest.raises(NotAcknowledgedError):
        server.client().ingest([("OrderPlaced", {})], attempts=2)
    assert len(server.requests) == 2
    reused = _answer(409, _error("IDEMPOTENCY_KEY_REUSED"))
    with pytest.raises(IdempotencyConflictError) as info:
        reused.client().ingest([("OrderPlaced", {})], idempotency_key="k-1")
    assert info.value.code == "IDEMPOTENCY_KEY_REUSED"
    assert len(reused.requests) == 1
    invalid = _answer(422, _error("EVENT_INVALID", errors=[]))
    with pytest.raises(InvalidEventsError):
        invalid.client().ingest([("OrderPlaced", {})])
    assert len(invalid.requests) == 1


def test_too_many_events_is_an_invalid_request_not_invalid_events():
    server = _answer(413, _error("TOO_MANY_EVENTS", "10001 events in one request"))
    with pytest.raises(InvalidRequestError) as info:
        server.client().ingest([("OrderPlaced", {})])
    assert type(info.value) is InvalidRequestError


def test_retry_after_as_a_date_is_not_guessed():
    server = _answer(503, _error("X"), {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    with pytest.raises(ServiceUnavailableError) as info:
        server.client().aggregate("p", "a")
    assert info.value.retry_after is None


def test_a_body_that_is_not_refolds_keeps_the_text():
    server = _Server(lambda _r: httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(ServerError) as info:
        server.client().entity("p", "t", "k")
    assert (info.value.code, info.value.body) == ("HTTP_502", "<html>bad gateway</html>")
    assert info.value.details == {}


def test_a_success_that_is_not_a_json_object_is_a_server_error():
    server = _Server(lambda _r: httpx.Response(200, text="ok"))
    with pytest.raises(ServerError, match="not JSON"):
        server.client().entity("p", "t", "k")
    server = _answer(200, [1, 2])
    with pytest.raises(ServerError, match="expected a JSON object"):
        server.client().entity("p", "t", "k")


def test_no_answer_is_unreachable():
    def refuse(request: httpx.Request) -> httpx.Response:
        msg = "connection refused"
        raise httpx.ConnectError(msg, request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        msg = "timed out"
        raise httpx.ReadTimeout(msg, request=request)

    with pytest.raises(UnreachableError, match="connection refused") as info:
        _Server(refuse).client().entity("p", "t", "k")
    assert (info.value.status, info.value.code) == (0, "UNREACHABLE")
    with pytest.raises(UnreachableError) as info:
        _Server(slow).client().entity("p", "t", "k")
    assert info.value.code == "TIMEOUT"


def test_a_given_http_client_is_used_and_left_open():
    server = _answer(200, {**FRESH, "counters": {}})
    http = httpx.Client(transport=httpx.MockTransport(server), headers={"X-Trace": "t1"})
    with RefoldClient("http://refold.test", "rfk_k", http_client=http) as client:
        client.aggregate("p", "a")
    assert not http.is_closed
    assert server.requests[0].headers["X-Trace"] == "t1"
    assert server.requests[0].headers["Authorization"] == "Bearer rfk_k"
    http.close()


def test_the_clients_own_http_client_is_closed():
    client = _answer(200, {}).client()
    client.close()
    assert client._http.is_closed
