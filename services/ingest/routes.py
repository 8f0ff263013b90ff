"""``POST /v1/events``: one event or a batch, validated whole, published, acknowledged.

Every event of a request is checked against its contract before any is sent: one invalid event
refuses the whole request (422, naming every wrong field of every refused event). Accepted
events go through the producer SDK (acks=all, idempotent, keyed by their aggregate id); the
answer gives each event's delivery position and one consistency token for the request. When the
broker does not acknowledge in time the answer is 503 with ``Retry-After``, listing the events
that were not acknowledged and the positions of those that were (which are in the log).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, Field

from contracts.errors import ContractError, EventValidationError
from services.api.context import ServiceContext, get_context
from services.api.errors import ApiError
from services.auth import require
from services.consistency import encode_token, positions_after
from services.errors import PublishError

__all__ = ["Delivery", "EventBatch", "EventIn", "IngestResponse", "ingest_router"]

_RETRY_AFTER_S = 5  # the broker did not answer within the timeout: try again a little later
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


def ingest_router() -> APIRouter:
    """The ingest route."""
    router = APIRouter(tags=["ingest"])

    @router.post(
        "/v1/events",
        response_model=IngestResponse,
        dependencies=[Depends(require("ingest"))],
        responses={
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
    ) -> IngestResponse:
        """Validate and publish one event or a batch."""
        items = [body] if isinstance(body, EventIn) else body.events
        limit = context.settings.serve.max_ingest_events
        if len(items) > limit:
            msg = f"{len(items)} events in one request; at most {limit} (send several requests)"
            raise ApiError(413, "TOO_MANY_EVENTS", msg)
        events = [(item.type, item.event) for item in items]
        publisher = context.publisher()
        refused = publisher.check(events)
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
            try:
                tokens = publisher.emit_many(events, timeout=timeout, validated=True)
            except PublishError as exc:
                delivered = [d for d in exc.delivered if d is not None]
                raise ApiError(
                    503,
                    exc.code,
                    str(exc),
                    headers={"Retry-After": str(_RETRY_AFTER_S)},
                    unacknowledged=[
                        {"index": u.index, "type": u.event_type, "error": u.error}
                        for u in exc.unacknowledged
                    ],
                    deliveries=[
                        None if d is None else {"topic": d[0], "partition": d[1], "offset": d[2]}
                        for d in exc.delivered
                    ],
                    consistency_token=encode_token(positions_after(delivered)),
                ) from exc
        finally:
            context.publish_lock.release()
        return IngestResponse(
            accepted=len(tokens),
            deliveries=[
                Delivery(topic=t.topic, partition=t.partition, offset=t.offset) for t in tokens
            ],
            consistency_token=encode_token(
                positions_after((t.topic, t.partition, t.offset) for t in tokens)
            ),
        )

    return router
