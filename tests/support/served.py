"""The HTTP services under a real uvicorn, on a free loopback port, in a thread of the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from refold.deploy.local_stack import free_port
from tests.support.waiting import assert_eventually


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve ``app`` (an ASGI app: ``create_app(...)``); yields its base URL, then stops it."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        assert_eventually(
            lambda: server.started, timeout=30, alive=thread.is_alive, message="uvicorn start"
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
