"""The hot read, one entity by key, answered before FastAPI's routing and middleware.

A plain single-key read is most of a query service's traffic. Through FastAPI it pays for
dependency solving (the key check and its two security schemes, the consistency parameters, the
path parameters: ~250 us here), then for the middleware stack and the routing over every route
(~50 us), more than its Redis round trip. :func:`answer_hot_read` runs first in the app
(:class:`~refold.services.api.app.RefoldApp`): a request it can answer from what the process
holds, it answers with the route's own code (:func:`~refold.services.query.routes.read_entity`);
it returns False for every other request, which then goes through the app as declared.

It answers ``GET /v1/processors/{name}/tables/{table}/entities/{key}`` when the request has no
query string (no consistency token, nothing to validate) and no body (nothing for the body
limit to refuse), the processor name is well formed (else the declared route's 422), the app
has no root path, and its API key is one this process has verified
(:func:`admitted_from_memory`; authentication off passes). An error it meets (a 404, a 429,
Redis unreachable) is answered by the app's own exception handler for it, as the declared
route's would be. So the answers, the errors and the OpenAPI schema are the route's, and the
route's code is their only owner.
"""

from __future__ import annotations

import inspect
import re

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from refold.services.auth.dependencies import admitted_from_memory
from refold.services.query.reads import Consistency
from refold.services.query.routes import NAME_PATTERN, read_entity

__all__ = ["answer_hot_read"]

_ENTITY = re.compile(
    r"/v1/processors/(" + NAME_PATTERN.strip("^$") + r")/tables/([^/]+)/entities/(.+)"
)


async def answer_hot_read(app: FastAPI, scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer ``scope`` if it is a plain entity read this process can admit; else False.

    False means nothing was sent, read or counted: the caller runs the app as declared.
    """
    if scope["type"] != "http" or scope["method"] != "GET" or scope["query_string"]:
        return False
    found = _ENTITY.fullmatch(scope["path"])
    if found is None or scope.get("root_path") or app.root_path:
        return False
    # ASGI names are lower-case; of a repeated header the first counts, as in Starlette's.
    headers: dict[bytes, bytes] = dict(reversed(tuple(scope["headers"])))
    if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
        return False
    scope["app"] = app
    context = app.state.context
    try:
        if not await admitted_from_memory(
            app, context, "query", _text(headers, b"authorization"), _text(headers, b"x-api-key")
        ):
            return False
        serve = context.settings.serve
        wanted = Consistency.of(
            None,
            None,
            None,
            default_wait_ms=serve.default_wait_ms,
            max_wait_s=serve.consistency_timeout_s,
        )
        name, table, key = found.groups()
        response = await read_entity(
            context, name, table, key, wanted, _text(headers, b"if-none-match")
        )
    except Exception as exc:  # answered by the app's handler for it, as the route's would be
        response = await _handled(app, Request(scope, receive), exc)
    await response(scope, receive, send)
    return True


def _text(headers: dict[bytes, bytes], name: bytes) -> str | None:
    """A header's value as Starlette decodes it (latin-1), None when absent."""
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


async def _handled(app: FastAPI, request: Request, exc: Exception) -> Response:
    """The answer of the app's exception handler for ``exc`` (the nearest class registered)."""
    for cls in type(exc).__mro__:
        handler = app.exception_handlers.get(cls)
        if handler is not None:
            response = handler(request, exc)  # refold's handlers are all async
            return await response if inspect.isawaitable(response) else response
    raise exc
