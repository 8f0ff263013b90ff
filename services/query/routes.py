"""Query routes: tables (one entity, a batch, a scan), aggregates and windows of any processor.

Every answer carries its freshness (processor, generation, applied positions) and a weak ETag
(``If-None-Match`` gives 304), and is read from one generation. ``consistency_token`` (from
ingest), ``min_positions`` and ``wait_ms`` make a read wait until the live generation has
applied the given positions (see :mod:`refold.services.query.reads`). ``generation=N`` reads
generation N instead of the live one: a state as of a moment (``replay --until``), or a retired
generation before ``replay gc`` removes it.

The routes are ``async``. The single-entity read, the hot one, awaits its round trip on the
process's auto-pipeline (:meth:`ServiceContext.redis_pipeline`: the reads a worker holds share
one round trip), so the loop serves other requests meanwhile; the other routes call Redis
synchronously: a read is one loopback round trip (two on a cluster; ~0.1 ms), cheaper inline
than a hop to the thread pool, and waits (sleeps) yield. The entity route's plain reads are
answered before FastAPI's routing (:mod:`refold.services.query.hot`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Response
from pydantic import BaseModel, Field

from refold.contracts.processors import ProcessorSpec
from refold.contracts.windows import scales_from_meta, windows_from_meta
from refold.services.api.context import ServiceContext, get_context
from refold.services.api.errors import ApiError
from refold.services.auth import require
from refold.services.query.pagination import ScanCursor, scan_page
from refold.services.query.reads import (
    Consistency,
    etag_of,
    freshness,
    json_default,
    not_modified,
    processor,
    read_consistent,
)
from refold.services.reader.state_reader import StateReader, StateView
from refold.services.reader.window_reader import WindowReader

__all__ = ["NAME_PATTERN", "query_router", "read_entity"]

# What a processor name may be in a query path.
NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"

_MAX_MS = 2**53  # event times are epoch ms; bounds keep range arithmetic small


class Freshness(BaseModel):
    """What every answer says about its state: where it was read and how fresh it is."""

    processor: str
    generation: int
    positions: dict[str, int] = Field(
        description="per source partition (topic/partition), the next offset to apply"
    )


class EntityAnswer(Freshness):
    """One entity."""

    key: str
    value: Any


class EntitiesAnswer(Freshness):
    """Several entities (null: no such entity)."""

    values: dict[str, Any]


class ScanItem(BaseModel):
    """An entity of a scan."""

    key: str
    value: Any


class PageAnswer(Freshness):
    """A page of a scan."""

    items: list[ScanItem]
    next_cursor: str | None = Field(description="null: the scan is complete")


class CountersAnswer(Freshness):
    """An aggregate's counters."""

    counters: dict[str, int]


class BatchGet(BaseModel):
    """Keys to read together, from one generation."""

    keys: list[str] = Field(min_length=1)


ConsistencyToken = Annotated[
    str | None, Query(description="from an ingest answer: read only after those writes")
]
MinPositions = Annotated[
    str | None,
    Query(description="read only after these positions: topic/partition:offset,..."),
]
WaitMs = Annotated[
    int | None,
    Query(
        ge=0,
        le=3_600_000,
        description="how long to wait for them (default 5000; 0: answer 409 at once)",
    ),
]

NamedGeneration = Annotated[
    int | None,
    Query(
        ge=1,
        description="read this generation instead of the live one (a state as of a moment: "
        "`replay --until`; `replay status` lists them)",
    ),
]


def _named(context: ServiceContext, spec: ProcessorSpec, generation: int | None) -> int | None:
    """``generation`` when the processor has it (404 ``GENERATION_UNKNOWN`` otherwise)."""
    if generation is not None and context.reader(spec.name).registry.status(generation) is None:
        msg = f"{spec.name} has no generation {generation}; `replay status` lists them"
        raise ApiError(404, "GENERATION_UNKNOWN", msg)
    return generation


# async although it does no I/O: FastAPI runs a sync dependency on the thread pool, a hop that
# cost ~0.25 ms of CPU per read (a third of a single-key read; bench/serving.py).
async def _consistency(
    context: Annotated[ServiceContext, Depends(get_context)],
    consistency_token: ConsistencyToken = None,
    min_positions: MinPositions = None,
    wait_ms: WaitMs = None,
) -> Consistency:
    serve = context.settings.serve
    return Consistency.of(
        consistency_token,
        min_positions,
        wait_ms,
        default_wait_ms=serve.default_wait_ms,
        max_wait_s=serve.consistency_timeout_s,
    )


def _answer(
    spec: ProcessorSpec, view: StateView, body: dict[str, Any], if_none_match: str | None
) -> Response:
    etag = etag_of(view.generation, body)
    headers = {"ETag": etag, "X-Refold-Generation": str(view.generation)}
    if not_modified(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    content = orjson.dumps({**freshness(spec, view), **body}, default=json_default)
    return Response(content, media_type="application/json", headers=headers)


async def read_entity(
    context: ServiceContext,
    name: str,
    table: str,
    key: str,
    wanted: Consistency,
    if_none_match: str | None,
    generation: int | None = None,
) -> Response:
    """The entity route's answer (its declared route and the hot path both call it).

    ``generation``: read that one, not the live one (it is not checked here: the route does).

    The read's round trip goes through the worker's auto-pipeline, shared with the other reads
    awaited in the same turn of the loop (:meth:`ServiceContext.redis_pipeline`); without an
    asyncio client it blocks.

    Raises:
        ApiError: 404 (no such processor, table or entity), 409/504 (consistency), 503
            (``REBUILDING``: the generation is catching up, a missing entity may exist).
    """
    spec = processor(name)
    _table(spec, table)
    reader, pipeline = context.reader(name), context.redis_pipeline()
    view = await read_consistent(
        context.redis,
        spec,
        context.key_prefix,
        wanted,
        (lambda: reader.get(table, key, generation, raw=True))
        if pipeline is None or generation is not None
        else (lambda: reader.get_async(pipeline, table, key, raw=True)),
    )
    if view.value is None:
        msg = f"{name} has no {table} entity {key!r} in generation {view.generation}"
        raise ApiError(404, "ENTITY_NOT_FOUND", msg, **freshness(spec, view))
    # The stored JSON goes out as it is, not decoded and encoded again (nor for the ETag).
    return _answer(spec, view, {"key": key, "value": orjson.Fragment(view.value)}, if_none_match)


def _table(spec: ProcessorSpec, table: str) -> None:
    if table not in spec.tables:
        known = ", ".join(spec.tables) or "none"
        msg = f"{spec.name} has no table {table!r} (its tables: {known})"
        raise ApiError(404, "TABLE_UNKNOWN", msg)


def _aggregate(spec: ProcessorSpec, name: str) -> None:
    if name not in spec.aggregates:
        known = ", ".join(spec.aggregates) or "none"
        msg = f"{spec.name} has no aggregate {name!r} (its aggregates: {known})"
        raise ApiError(404, "AGGREGATE_UNKNOWN", msg)


def _windows(
    context: ServiceContext,
    spec: ProcessorSpec,
    read: Callable[[WindowReader, int], StateView],
    named: int | None = None,
) -> Callable[[], StateView]:
    """A window read of one generation (``named``, else the live one), resolved once per call.

    The reader uses the window definitions that generation recorded (a replay may change them).
    """

    def run() -> StateView:
        alias = context.reader(spec.name)
        generation = alias.live_generation() if named is None else named
        meta = alias.registry.meta(generation)
        windows, distinct = windows_from_meta(meta)
        lateness = spec.event_time.lateness_ms if spec.event_time is not None else 0
        reader = WindowReader(
            context.redis,
            spec.name,
            windows,
            distinct,
            context.key_prefix,
            lateness_ms=lateness,
            scales=scales_from_meta(meta),
        )
        return read(reader, generation)

    return run


def _live_positions(reader: StateReader, named: int | None = None) -> StateView:
    """The live generation (or ``named``) and its positions (the generation resolved once)."""
    generation = reader.live_generation() if named is None else named
    return StateView(generation, None, reader.freshness(generation))


# Documented answers besides 200 (bodies: refold.services.api.errors).
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {
        "description": "no such processor, table, entity or generation, or no live generation yet"
    },
    409: {"description": "wait_ms=0 and the consistency positions are not applied yet"},
    410: {"description": "the scan's generation was removed (replay gc): start again"},
    503: {
        "description": "REBUILDING: the generation is catching up from far behind the log "
        "(its processor started it from nothing): ask again after Retry-After; or the store "
        "did not answer"
    },
    504: {"description": "the consistency positions were not applied within wait_ms"},
}

Context = Annotated[ServiceContext, Depends(get_context)]
Wanted = Annotated[Consistency, Depends(_consistency)]
IfNoneMatch = Annotated[str | None, Header()]
Processor = Annotated[str, Path(pattern=NAME_PATTERN)]


def query_router() -> APIRouter:
    """The query routes."""
    router = APIRouter(tags=["query"], dependencies=[Depends(require("query"))])

    async def get_entity(
        name: Processor,
        table: str,
        key: str,
        context: Context,
        wanted: Wanted,
        if_none_match: IfNoneMatch = None,
        generation: NamedGeneration = None,
    ) -> Response:
        """One entity's state (404 with the freshness when it does not exist)."""
        named = _named(context, processor(name), generation)
        return await read_entity(context, name, table, key, wanted, if_none_match, named)

    router.add_api_route(
        "/v1/processors/{name}/tables/{table}/entities/{key:path}",
        get_entity,
        methods=["GET"],
        responses={200: {"model": EntityAnswer}, **_ERRORS},
    )

    @router.post(
        "/v1/processors/{name}/tables/{table}/entities:batch-get",
        responses={200: {"model": EntitiesAnswer}, **_ERRORS},
    )
    async def get_entities(
        name: Processor,
        table: str,
        body: BatchGet,
        context: Context,
        wanted: Wanted,
        generation: NamedGeneration = None,
    ) -> Response:
        """Several entities, from one generation (``null`` for those that do not exist)."""
        spec = processor(name)
        _table(spec, table)
        limit = context.settings.serve.max_batch_keys
        if len(body.keys) > limit:
            msg = f"{len(body.keys)} keys in one batch get; at most {limit}"
            raise ApiError(413, "TOO_MANY_KEYS", msg)
        reader = context.reader(name)
        view = await read_consistent(
            context.redis,
            spec,
            context.key_prefix,
            wanted,
            lambda: reader.get_many(table, body.keys, _named(context, spec, generation)),
        )
        return _answer(spec, view, {"values": view.value}, None)

    @router.get(
        "/v1/processors/{name}/tables/{table}/entities",
        responses={200: {"model": PageAnswer}, **_ERRORS},
    )
    async def scan_entities(
        name: Processor,
        table: str,
        context: Context,
        wanted: Wanted,
        limit: Annotated[int | None, Query(ge=1, description="page size (about)")] = None,
        cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
        generation: NamedGeneration = None,
    ) -> Response:
        """A page of a table's entities; follow ``next_cursor`` until it is null."""
        spec = processor(name)
        _table(spec, table)
        serve = context.settings.serve
        size = min(limit or serve.page_size, serve.max_page_size)
        reader = context.reader(name)
        if cursor is None:
            start = await read_consistent(
                context.redis,
                spec,
                context.key_prefix,
                wanted,
                lambda: _live_positions(reader, _named(context, spec, generation)),
            )
            at = ScanCursor(name, table, start.generation, 0)
        else:
            at = ScanCursor.decode(cursor, name, table)
        page = scan_page(reader.registry, table, at, size)
        view = StateView(page.generation, None, reader.freshness(page.generation))
        body = {
            "items": [{"key": k, "value": v} for k, v in page.items],
            "next_cursor": page.next_cursor,
        }
        return _answer(spec, view, body, None)

    @router.get(
        "/v1/processors/{name}/aggregates/{aggregate}",
        responses={200: {"model": CountersAnswer}, **_ERRORS},
    )
    async def get_aggregate(
        name: Processor,
        aggregate: str,
        context: Context,
        wanted: Wanted,
        if_none_match: IfNoneMatch = None,
        generation: NamedGeneration = None,
    ) -> Response:
        """An aggregate's counters (counters at zero are left out)."""
        spec = processor(name)
        _aggregate(spec, aggregate)
        reader = context.reader(name)
        named = _named(context, spec, generation)
        view = await read_consistent(
            context.redis,
            spec,
            context.key_prefix,
            wanted,
            lambda: reader.aggregate(aggregate, named),
        )
        return _answer(spec, view, {"counters": view.value}, if_none_match)

    @router.get("/v1/processors/{name}/windows/{window}/groups")
    async def window_groups(
        name: Processor, window: str, context: Context, generation: NamedGeneration = None
    ) -> Response:
        """The groups that have data in ``window``."""
        spec = processor(name)
        named = _named(context, spec, generation)
        view = _windows(context, spec, lambda r, g: r.groups(window, g), named)()
        return _answer(spec, view, {"window": window, "groups": view.value}, None)

    @router.get("/v1/processors/{name}/windows/{window}/groups/{group}")
    async def window_range(
        name: Processor,
        window: str,
        group: str,
        context: Context,
        wanted: Wanted,
        start: Annotated[
            int, Query(ge=0, le=_MAX_MS, description="epoch ms: windows ending after it")
        ],
        end: Annotated[
            int, Query(ge=0, le=_MAX_MS, description="epoch ms: windows ending at or before it")
        ],
        if_none_match: IfNoneMatch = None,
        generation: NamedGeneration = None,
    ) -> Response:
        """Every window of ``group`` ending in ``(start, end]`` that has data, oldest first."""
        spec = processor(name)
        named = _named(context, spec, generation)
        view = await read_consistent(
            context.redis,
            spec,
            context.key_prefix,
            wanted,
            _windows(context, spec, lambda r, g: r.range(window, group, start, end, g), named),
        )
        body = {"window": window, "group": group, "results": view.value}
        return _answer(spec, view, body, if_none_match)

    @router.get("/v1/processors/{name}/windows/{window}/distinct/{measure}")
    async def window_distinct(
        name: Processor,
        window: str,
        measure: str,
        context: Context,
        wanted: Wanted,
        group: Annotated[str, Query(description="the group")],
        start: Annotated[
            int, Query(ge=0, le=_MAX_MS, description="epoch ms: buckets starting at or after it")
        ],
        end: Annotated[
            int, Query(ge=0, le=_MAX_MS, description="epoch ms: buckets starting before it")
        ],
        generation: NamedGeneration = None,
    ) -> Response:
        """The estimated number of distinct ``measure`` values over ``[start, end)``."""
        spec = processor(name)
        named = _named(context, spec, generation)
        view = await read_consistent(
            context.redis,
            spec,
            context.key_prefix,
            wanted,
            _windows(
                context,
                spec,
                lambda r, g: r.distinct(window, measure, group, start, end, g),
                named,
            ),
        )
        body = {"window": window, "measure": measure, "group": group, "distinct": view.value}
        return _answer(spec, view, body, None)

    @router.get("/v1/processors/{name}/watermark")
    async def watermark(
        name: Processor, context: Context, generation: NamedGeneration = None
    ) -> Response:
        """The processor's event-time watermark and its partitions' clocks."""
        spec = processor(name)
        view = _windows(
            context, spec, lambda r, g: r.watermark(g), _named(context, spec, generation)
        )()
        mark = view.value
        body = {
            "watermark": mark.watermark,
            "lateness_ms": mark.lateness_ms,
            "clocks": mark.clocks,
        }
        return _answer(spec, view, body, None)

    return router
