"""A request body over ``max_request_bytes`` gets a 413 before anything parses it.

FastAPI parses a JSON body whole before a route runs, and neither Starlette nor uvicorn bounds a
body's size (uvicorn bounds headers only): a 4.8 MB batch of malformed events kept a worker busy
for 10 s. This pure ASGI middleware refuses a declared ``Content-Length`` over the limit at
once, and stops reading a chunked body as soon as it passes the limit. It is hand-written
because the maintained options are a whole framework's (a reverse proxy's
``client_max_body_size``, which refold users may also set) and this is a few lines of ASGI.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from refold.services.api.errors import error_body

__all__ = ["BodyLimit"]


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


class BodyLimit:
    """ASGI middleware: a body of more than ``max_bytes`` is answered 413 ``REQUEST_TOO_LARGE``.

    Args:
        app: The application.
        max_bytes: The largest body accepted.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, reading at most ``max_bytes`` of its body."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, f"{int(declared):,} bytes")
            return
        received = 0
        started = refused = False

        async def limited() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes and not started:
                    # Answered here; the app sees a client that went away and its answer
                    # to that is dropped (FastAPI turns an error raised here into a 400).
                    refused = True
                    await self._refuse(scope, send, f"more than {self.max_bytes:,} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited, tracked)

    async def _refuse(self, scope: Scope, send: Send, size: str) -> None:
        msg = (
            f"the request body has {size}; at most {self.max_bytes:,} bytes are accepted "
            "(max_request_bytes): send several smaller requests"
        )
        body = error_body("REQUEST_TOO_LARGE", msg, max_request_bytes=self.max_bytes)
        # The connection closes: the rest of the body is never read.
        response = JSONResponse(body, 413, headers={"Connection": "close"})
        await response(scope, _no_body, send)
