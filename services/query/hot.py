"""The hot read, one entity by key, answered without FastAPI's per-request dependency solving.

FastAPI solves a route's dependencies on every request (the key check and its two security
schemes, the consistency parameters, the path parameters): ~250 us of CPU here, more than the
Redis read itself. :class:`HotEntityRoute` is the entity route's class. A request without query
parameters (no consistency token, nothing to validate), whose processor name is well formed and
whose key this process has verified (:func:`~refold.services.auth.admitted_from_memory`) calls
the route's endpoint at once, with the values FastAPI would have given it. Every other request
(a token, a key to look up in Redis, anything refused) runs the route as declared, so the
answers, the errors and the OpenAPI schema are the route's, and the route's code is their only
owner.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from refold.services.api.context import get_context
from refold.services.auth.dependencies import admitted_from_memory
from refold.services.query.reads import Consistency

__all__ = ["NAME_PATTERN", "HotEntityRoute"]

# What a processor name may be in a query path (the declared routes validate it too).
NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"
_NAME = re.compile(NAME_PATTERN)


class HotEntityRoute(APIRoute):
    """The route of ``GET .../tables/{table}/entities/{key}`` (scope ``query``).

    Its endpoint takes ``name``, ``table``, ``key``, ``context``, ``wanted`` and
    ``if_none_match``.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The declared handler, behind the path that skips it for a plain read."""
        declared = super().get_route_handler()
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            params = request.path_params
            if request.scope.get("query_string") or not _NAME.fullmatch(params["name"]):
                return await declared(request)
            context = await get_context(request)
            if not await admitted_from_memory(request, context, "query"):
                return await declared(request)
            serve = context.settings.serve
            wanted = Consistency.of(
                None,
                None,
                None,
                default_wait_ms=serve.default_wait_ms,
                max_wait_s=serve.consistency_timeout_s,
            )
            response: Response = await endpoint(
                name=params["name"],
                table=params["table"],
                key=params["key"],
                context=context,
                wanted=wanted,
                if_none_match=request.headers.get("if-none-match"),
            )
            return response

        return handler
