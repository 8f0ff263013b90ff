"""The monitoring routes: processors, generations, lag, stats, replays, ``/metrics``, ``/health``.

Read-only. The ``/v1`` routes need the ``query`` scope; ``/metrics`` and ``/health`` are open,
as scrapers and load balancers carry no key (put them behind the network's own controls).

``/health`` is for alerting: it answers 503 while a processor is stalled, which says nothing
about this service, so point a load balancer's or Kubernetes' probes at ``/health/live``.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)

from refold.contracts.kafka.offsets import OffsetsError
from refold.services.api.context import ServiceContext, get_context
from refold.services.api.errors import ApiError
from refold.services.auth import require
from refold.services.monitor.metrics import RefoldCollector
from refold.services.monitor.models import (
    GenerationModel,
    GenerationsResponse,
    HealthResponse,
    LagResponse,
    LiveResponse,
    ProcessorModel,
    ProcessorsResponse,
    ReplayModel,
    ReplaysResponse,
    StallModel,
    StatsModel,
    StatsResponse,
)
from refold.services.monitor.status import Monitor

__all__ = ["monitor_for", "monitor_router"]

logger = logging.getLogger(__name__)

_MADE = threading.Lock()  # guards only the first creation of an app's monitor
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such processor (PROCESSOR_UNKNOWN) or generation"}
}
GenerationParam = Annotated[
    int | None, Query(ge=1, description="a generation number (default: the live one)")
]


def monitor_for(request: Request, context: ServiceContext) -> tuple[Monitor, CollectorRegistry]:
    """The app's monitor and metrics registry (made on first use; a new context, new ones)."""
    state = request.app.state
    current: tuple[ServiceContext, Monitor, CollectorRegistry] | None = getattr(
        state, "monitor", None
    )
    if current is None or current[0] is not context:
        with _MADE:
            current = getattr(state, "monitor", None)
            if current is None or current[0] is not context:
                monitor = Monitor(context)
                registry = CollectorRegistry()
                registry.register(RefoldCollector(monitor))
                ProcessCollector(registry=registry)  # this process' CPU, memory, open files
                current = (context, monitor, registry)
                state.monitor = current
    return current[1], current[2]


def _monitor(request: Request, context: Annotated[ServiceContext, Depends(get_context)]) -> Monitor:
    return monitor_for(request, context)[0]


MonitorDep = Annotated[Monitor, Depends(_monitor)]


def monitor_router() -> APIRouter:
    """The monitoring routes (see the module docstring)."""
    router = APIRouter()
    query = [Depends(require("query"))]

    @router.get(
        "/v1/processors", response_model=ProcessorsResponse, dependencies=query, tags=["control"]
    )
    def list_processors(monitor: MonitorDep) -> ProcessorsResponse:
        """Every processor (registered, or found in Redis) with its generations and lag."""
        infos = monitor.processors()
        views = {info.name: monitor.generations(info) for info in infos}
        items = [(info, view) for info in infos for view in views[info.name]]
        lags = monitor.lags(items, monitor.deadline(), seconds=False)
        by_gen = {(lag.processor, lag.generation): lag for lag in lags}
        return ProcessorsResponse(
            processors=[
                ProcessorModel.of(
                    info,
                    monitor.live(info),
                    [
                        GenerationModel.of(v, by_gen.get((info.name, v.generation)))
                        for v in views[info.name]
                    ],
                )
                for info in infos
            ]
        )

    @router.get(
        "/v1/processors/{name}/generations",
        response_model=GenerationsResponse,
        dependencies=query,
        tags=["control"],
        responses=_NOT_FOUND,
    )
    def list_generations(name: str, monitor: MonitorDep) -> GenerationsResponse:
        """A processor's generations (building, live, retired) with their lag."""
        info = monitor.processor(name)
        views = monitor.generations(info)
        lags = monitor.lags([(info, v) for v in views], monitor.deadline(), seconds=False)
        return GenerationsResponse(
            processor=info.name,
            generations=[GenerationModel.of(v, lag) for v, lag in zip(views, lags, strict=True)],
        )

    @router.get(
        "/v1/processors/{name}/lag",
        response_model=LagResponse,
        dependencies=query,
        tags=["control"],
        responses={**_NOT_FOUND, 503: {"description": "the broker did not answer in time"}},
    )
    def processor_lag(
        name: str, monitor: MonitorDep, generation: GenerationParam = None
    ) -> LagResponse:
        """Lag per partition, in records and seconds, of the live (or a given) generation."""
        info = monitor.processor(name)
        view = monitor.generation(info, generation)
        if view is None:
            raise ApiError(404, "GENERATION_UNKNOWN", f"{info.name} has no generation {generation}")
        lag = monitor.lags([(info, view)], monitor.deadline())[0]
        if not lag.complete:
            error = monitor.probe.last_error or "no answer in time"
            msg = f"the broker did not tell the log ends of {info.name}'s topics: {error}"
            raise OffsetsError(msg)
        if view.status == "live" or view.running:
            for part in lag.partitions:  # a sample for stall detection too
                if part.lag_records is not None:
                    key = (info.name, view.generation, part.topic, part.partition)
                    monitor.stalls.observe(key, part.position, part.lag_records)
        return LagResponse.of(lag)

    @router.get(
        "/v1/processors/{name}/stats",
        response_model=StatsResponse,
        dependencies=query,
        tags=["control"],
        responses=_NOT_FOUND,
    )
    def processor_stats(
        name: str, monitor: MonitorDep, generation: GenerationParam = None
    ) -> StatsResponse:
        """What each generation's micro-batches did (or one generation's, with ``generation``)."""
        info = monitor.processor(name)
        views = [v for v in monitor.generations(info) if generation in (None, v.generation)]
        if generation is not None and not views:
            raise ApiError(404, "GENERATION_UNKNOWN", f"{info.name} has no generation {generation}")
        stats = monitor.stats(info, [v.generation for v in views])
        return StatsResponse(
            processor=info.name,
            generations=[StatsModel.of(v.generation, v.status, stats[v.generation]) for v in views],
        )

    @router.get("/v1/replays", response_model=ReplaysResponse, dependencies=query, tags=["control"])
    def list_replays(monitor: MonitorDep) -> ReplaysResponse:
        """Every generation being built, with progress, rate and ETA to the log end."""
        return ReplaysResponse(
            replays=[ReplayModel.of(r) for r in monitor.replays(monitor.deadline())]
        )

    @router.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus"}},
    )
    def metrics(
        request: Request, context: Annotated[ServiceContext, Depends(get_context)]
    ) -> Response:
        """Metrics in the Prometheus text format (open: scrapers carry no key)."""
        registry = monitor_for(request, context)[1]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @router.get(
        "/health",
        response_model=HealthResponse,
        tags=["operations"],
        responses={503: {"model": HealthResponse, "description": "a processor is stalled"}},
    )
    def health(monitor: MonitorDep) -> JSONResponse:
        """200 when no processor is stalled; 503 with the stalled partitions otherwise."""
        stall_after_s = monitor.stalls.stall_after_s
        try:
            watched = monitor.watch(monitor.deadline())
        except redis.RedisError as exc:
            logger.warning("health: Redis did not answer: %s", exc)
            body = HealthResponse(status="unavailable", stall_after_s=stall_after_s, error=str(exc))
            return JSONResponse(body.model_dump(), 503, headers={"Retry-After": "1"})
        stalled = [StallModel.of(s) for w in watched for s in w.stalls]
        unknown = [f"{w.info.name}/g{w.view.generation}" for w in watched if not w.lag.complete]
        body = HealthResponse(
            status="stalled" if stalled else "ok",
            stalled=stalled,
            unknown=unknown,
            stall_after_s=stall_after_s,
        )
        return JSONResponse(body.model_dump(), 503 if stalled else 200)

    @router.get("/health/live", response_model=LiveResponse, tags=["operations"])
    def health_live() -> LiveResponse:
        """Always 200 while the process answers (for load balancers and liveness probes)."""
        return LiveResponse()

    return router
