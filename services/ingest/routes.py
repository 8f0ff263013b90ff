"""``POST /v1/events``: one event or a batch, validated whole, published, acknowledged.

Every event of a request is checked against its contract before any is sent: one invalid event
refuses the whole request (422, naming every wrong field of every refused event). Accepted
events go through the producer SDK (acks=all, idempotent, keyed by their aggregate id); the
answer gives each event's delivery position and one consistency token for the request. When the
broker does not acknowledge in time the answer is 503 with ``Retry-After``, listing the events
that were not acknowledged and the positions of those that were (which are in the log).

With an ``Idempotency-Key`` header, retries of a request are answered, not produced again
(:mod:`refold.services.ingest.idempotency`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Body, Depends, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from refold.contracts.errors import ContractError, EventValidationError
from refold.services.api.context import ServiceContext, get_context
from refold.services.api.errors import ApiError
from refold.services.auth import ApiKey, require
from refold.services.consistency import encode_token, positions_after
from refold.services.errors import PublishError
from refold.services.ingest.idempotency import body_sha256

__all__ = ["Delivery", "EventBatch", "EventIn", "IngestResponse", "ingest_router"]

logger = logging.getLogger(__name__)

_RETRY_AFTER_S = 5  # the broker did not answer within the timeout: try again a little later
_IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,255}")
_FIELD = re.compile(r"^([\w.\[\]]+) is ")  # "commerce.OrderPlaced.amount is ..."


class EventIn(BaseModel):
    """One event: its record name and its fields as JSON."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1, examples=["OrderPlaced"], description="record name")
    event: dict[str, Any] = Field(description="the event's fields, as its Avro contract says")


class EventBatch(BaseModel):
    """Several events, published in order (per key, their order in the log)."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1)


class Delivery(BaseModel):
    """Where an event was written."""

    topic: str
    partition: int
    offset: int


class IngestResponse(BaseModel):
    """Every event was acknowledged by the broker (acks=all)."""

    accepted: int
    deliveries: list[Delivery]
    consistency_token: str = Field(
        description="pass it to a query (consistency_token=) to read these writes"
    )


def _field(problem: str, event_type: str) -> str | None:
    """The field a problem names: ``commerce.OrderPlaced.amount is ...`` -> ``amount``."""
    match = _FIELD.match(problem)
    if match is None:
        return None
    path = match.group(1)
    marker = f"{event_type}."
    return path[path.rindex(marker) + len(marker) :] if marker in path else path


def _refusal(index: int, event_type: str, exc: ContractError) -> dict[str, Any]:
    problems = exc.problems if isinstance(exc, EventValidationError) else [str(exc)]
    fields = [f for p in problems if (f := _field(p, event_type)) is not None]
    return {
        "index": index,
        "type": event_type,
        "code": exc.code,
        "fields": fields,
        "problems": problems,
    }


def _response(deliveries: list[Delivery]) -> IngestResponse:
    return IngestResponse(
        accepted=len(deliveries),
        deliveries=deliveries,
        consistency_token=encode_token(
            positions_after((d.topic, d.partition, d.offset) for d in deliveries)
        ),
    )


def _send(context: ServiceContext, events: list[tuple[str, dict[str, Any]]]) -> list[Delivery]:
    """Publish validated events, one call at a time; where each went.

    Raises:
        ApiError: 503 ``INGEST_BUSY``: earlier requests still wait for the broker; nothing sent.
        PublishError: Not acknowledged in time (some events may be written).
    """
    timeout = context.settings.serve.ingest_timeout_s
    # One publish call at a time (see ServiceContext.publish_lock); a request does not wait
    # for the lock longer than for the broker, so an outage cannot pile requests up.
    if not context.publish_lock.acquire(timeout=timeout):
        msg = (
            f"the service is still waiting for the broker on earlier requests after "
            f"{timeout:g}s; nothing of this request was sent. Retry later."
        )
        raise ApiError(503, "INGEST_BUSY", msg, headers={"Retry-After": str(_RETRY_AFTER_S)})
    try:
        tokens = context.publisher().emit_many(events, timeout=timeout, validated=True)
    finally:
        context.publish_lock.release()
    return [Delivery(topic=t.topic, partition=t.partition, offset=t.offset) for t in tokens]


def _not_acknowledged(
    exc: PublishError, deliveries: list[Delivery | None], indices: list[int]
) -> ApiError:
    """The 503 of a publish that timed out; ``indices``: each sent event's index in the request."""
    delivered = [(d.topic, d.partition, d.offset) for d in deliveries if d is not None]
    return ApiError(
        503,
        exc.code,
        str(exc),
        headers={"Retry-After": str(_RETRY_AFTER_S)},
        unacknowledged=[
            {"index": indices[u.index], "type": u.event_type, "error": u.error}
            for u in exc.unacknowledged
        ],
        deliveries=[None if d is None else d.model_dump() for d in deliveries],
        consistency_token=encode_token(positions_after(delivered)),
    )


def _merge(deliveries: list[Delivery | None], indices: list[int], sent: Sequence[Any]) -> None:
    """Put the deliveries of the events sent (``indices`` in the request) into ``deliveries``."""
    for index, delivery in zip(indices, sent, strict=True):
        if isinstance(delivery, Delivery):
            deliveries[index] = delivery
        elif delivery is not None:  # PublishError.delivered: (topic, partition, offset)
            deliveries[index] = Delivery(
                topic=delivery[0], partition=delivery[1], offset=delivery[2]
            )


def _publish(context: ServiceContext, events: list[tuple[str, dict[str, Any]]]) -> IngestResponse:
    """Without an idempotency key: send every event."""
    indices = list(range(len(events)))
    try:
        return _response(_send(context, events))
    except PublishError as exc:
        deliveries: list[Delivery | None] = [None] * len(events)
        _merge(deliveries, indices, exc.delivered)
        raise _not_acknowledged(exc, deliveries, indices) from exc


def _publish_once(
    context: ServiceContext,
    events: list[tuple[str, dict[str, Any]]],
    key: str,
    caller: str,
) -> IngestResponse | JSONResponse:
    """With an idempotency key: send what no earlier request with the key has delivered."""
    if _IDEMPOTENCY_KEY.fullmatch(key) is None:
        msg = "Idempotency-Key must be 1 to 255 printable ASCII characters"
        raise ApiError(400, "IDEMPOTENCY_KEY_INVALID", msg)
    store = context.idempotency()
    try:
        claim = store.claim(caller, key, body_sha256(events))
    except redis.RedisError as exc:
        msg = f"idempotency keys cannot be checked now (Redis: {exc}); nothing was sent"
        raise ApiError(503, "IDEMPOTENCY_UNAVAILABLE", msg, headers={"Retry-After": "1"}) from exc
    if claim.outcome not in ("new", "resumed"):
        if not claim.same_body:
            msg = (
                "this Idempotency-Key was used for a request with other events: use a new key "
                "for new events"
            )
            raise ApiError(409, "IDEMPOTENCY_KEY_REUSED", msg)
        if claim.outcome == "done" and claim.response is not None:
            return JSONResponse(claim.response, headers={"Idempotent-Replayed": "true"})
        msg = "a request with this Idempotency-Key is still running: retry when it is done"
        raise ApiError(409, "IDEMPOTENCY_KEY_IN_USE", msg, headers={"Retry-After": "1"})
    deliveries: list[Delivery | None] = [
        None if d is None else Delivery(**d) for d in claim.deliveries
    ] or [None] * len(events)
    missing = [i for i, d in enumerate(deliveries) if d is None]
    try:
        sent = _send(context, [events[i] for i in missing])
    except PublishError as exc:
        _merge(deliveries, missing, exc.delivered)
        _record(store.keep_partial, caller, key, [_dumped(d) for d in deliveries])
        raise _not_acknowledged(exc, deliveries, missing) from exc
    except ApiError:  # nothing was sent: the key is as it was
        if claim.outcome == "new":
            _record(store.release, caller, key)
        else:
            _record(store.keep_partial, caller, key, [_dumped(d) for d in deliveries])
        raise
    _merge(deliveries, missing, sent)
    done = [d for d in deliveries if d is not None]
    response = _response(done)
    _record(store.finish, caller, key, [d.model_dump() for d in done], response.model_dump())
    return response


def _dumped(delivery: Delivery | None) -> dict[str, Any] | None:
    return None if delivery is None else delivery.model_dump()


def _record(call: Callable[..., None], *args: Any) -> None:
    """Update a key's record; if Redis fails now, the claim expires and a retry sends again."""
    try:
        call(*args)
    except redis.RedisError:
        logger.exception("could not record an idempotency key's outcome")


def ingest_router() -> APIRouter:
    """The ingest route."""
    router = APIRouter(tags=["ingest"])

    @router.post(
        "/v1/events",
        response_model=IngestResponse,
        responses={
            400: {"description": "an Idempotency-Key that is not 1-255 printable characters"},
            409: {
                "description": "the Idempotency-Key is in use by a running request, or was "
                "used for other events"
            },
            413: {
                "description": "more events than max_ingest_events, or a body over "
                "max_request_bytes"
            },
            422: {"description": "an event breaks its contract: nothing of the request was sent"},
            503: {"description": "not acknowledged in time; the body says which events"},
        },
    )
    def ingest(
        body: Annotated[EventBatch | EventIn, Body()],
        context: Annotated[ServiceContext, Depends(get_context)],
        caller: Annotated[ApiKey | None, Depends(require("ingest"))],
        idempotency_key: Annotated[
            str | None,
            Header(
                description="the same key on every retry of a request: it is produced once "
                f"(kept for idempotency_horizon_s, default {24 * 3600} s)"
            ),
        ] = None,
    ) -> IngestResponse | JSONResponse:
        """Validate and publish one event or a batch."""
        items = [body] if isinstance(body, EventIn) else body.events
        limit = context.settings.serve.max_ingest_events
        if len(items) > limit:
            msg = f"{len(items)} events in one request; at most {limit} (send several requests)"
            raise ApiError(413, "TOO_MANY_EVENTS", msg)
        events = [(item.type, item.event) for item in items]
        refused = context.publisher().check(events)
        if refused:
            # The first refusals in full, the rest counted: a batch of 10,000 bad events once
            # answered 90 MB of errors.
            cap = context.settings.serve.max_reported_errors
            errors = [_refusal(i, events[i][0], exc) for i, exc in refused[:cap]]
            named = "; ".join(f"#{e['index']} {'; '.join(e['problems'])}" for e in errors[:5])
            msg = f"{len(refused)} of {len(events)} events refused, nothing was sent: {named}" + (
                f"; and {len(refused) - 5} more (see errors)" if len(refused) > 5 else ""
            )
            raise ApiError(
                422, "EVENT_INVALID", msg, errors=errors, errors_omitted=len(refused) - len(errors)
            )
        if idempotency_key is None:
            return _publish(context, events)
        return _publish_once(context, events, idempotency_key, "-" if caller is None else caller.id)

    return router
