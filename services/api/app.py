"""``create_app``: the one ASGI app of refold's HTTP services.

Its routers each live with their concern (``refold.services.ingest``, ``refold.services.query``,
``refold.services.monitor``, ``refold.services.dashboard``); the destructive control routes come
from the replay package and are passed in by the composition root (``deploy/serve_cli.py``), since
services do not import replay. Everything the app knows comes from Kafka and Redis, so any number of
copies serve the same answers behind a load balancer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.types import Receive, Scope, Send

from refold.services.api.body_limit import BodyLimit
from refold.services.api.config import ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.api.errors import install_error_handlers
from refold.services.query.hot import answer_hot_read

__all__ = ["RefoldApp", "close_app", "create_app"]

_DESCRIPTION = """
Ingest domain events, read materialized state with its freshness (read your own writes with a
consistency token), watch processors, lag and replays, and run replays.

Authentication: `Authorization: Bearer <API key>` (or `X-API-Key`), keys made with
`refold keys add --scope ingest|query|admin`.
"""


# How often the app asks whether FastAPI's OpenTelemetry instrumentation is on (a provider is
# usually set at start-up; asking costs ~5 us, a fortieth of a read).
_TELEMETRY_EVERY_S = 1.0


class RefoldApp(FastAPI):
    """FastAPI, with the hot entity read answered before its routing and middleware.

    :func:`~refold.services.query.hot.answer_hot_read` answers a plain single-key read it can
    admit from memory, with the route's own code; every other request runs as declared. While
    FastAPI's OpenTelemetry instrumentation is on (a tracer, meter or logger provider is set),
    or once a user adds middleware of their own to the app, every request goes through FastAPI,
    to be traced or to pass their middleware.
    """

    _instrumented: tuple[float, bool] = (-_TELEMETRY_EVERY_S, True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the hot read, or pass the request to FastAPI."""
        if (
            scope["type"] == "http"
            and not self._traced()
            and self._only_own_middleware()
            and await answer_hot_read(self, scope, receive, send)
        ):
            return
        await super().__call__(scope, receive, send)

    def _only_own_middleware(self) -> bool:
        """Whether the app's middleware is refold's own (its body limit) only."""
        own: object = BodyLimit
        return all(m.cls is own for m in self.user_middleware)

    def _traced(self) -> bool:
        """Whether FastAPI's own instrumentation is on (asked at most once a second)."""
        asked, on = self._instrumented
        now = time.monotonic()
        if now - asked >= _TELEMETRY_EVERY_S:
            telemetry: Any = getattr(self, "_native_telemetry", None)  # FastAPI >= 0.13x
            on = telemetry is not None and bool(telemetry.enabled())
            self._instrumented = (now, on)
        return on


def create_app(
    settings: ServeSettings,
    *,
    context: ServiceContext | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The ASGI app.

    Args:
        settings: Its settings.
        context: Shared clients (default: made from ``settings``; closed at shutdown).
        routers: More routers to mount (the replay control routes).
    """
    from refold.services.dashboard.routes import dashboard_router
    from refold.services.ingest.routes import ingest_router
    from refold.services.monitor.routes import monitor_router
    from refold.services.query.routes import query_router

    shared = context or ServiceContext.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        close_app(app)
        await shared.close_async_redis()
        if context is None:
            shared.close()

    app = RefoldApp(
        title="refold",
        description=_DESCRIPTION,
        version="1",
        lifespan=lifespan,
    )
    app.state.context = shared
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=shared.settings.serve.max_request_bytes)
    for router in (ingest_router(), query_router(), monitor_router(), dashboard_router(), *routers):
        app.include_router(router)
    return app


def close_app(app: FastAPI) -> None:
    """Stop what the app's routes started (the monitor's log probe); idempotent.

    The lifespan calls it at shutdown; a caller that drives the app without one (an ASGI
    test harness) calls it itself, then closes the context it passed in.
    """
    made = getattr(app.state, "monitor", None)
    if made is not None:
        made[1].probe.close()
