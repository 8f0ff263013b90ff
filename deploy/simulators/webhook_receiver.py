"""A real local webhook receiver: records, deduplicates, fails on purpose, goes down and up.

For tests, benchmarks and the demo. An HTTP/1.1 server (the standard library's
``ThreadingHTTPServer``, keep-alive) in a background thread on a loopback port::

    with WebhookReceiver(fail_every=5) as receiver:    # every 5th request answers 503
        ...  # POST to receiver.url
        receiver.down()                                 # outage: connections refused
        receiver.up()                                   # back, same port
        receiver.accepted                               # Idempotency-Key -> first body

What it does with a request, in order:

1. a signing secret is set and the Standard Webhooks signature does not verify: 401;
2. no ``Idempotency-Key`` header, or a body that is not JSON: 400;
3. a failure is due (every ``fail_every``-th request, or with probability ``failure_rate``
   from a seeded generator, so runs repeat): ``fail_status`` (503), with ``Retry-After`` if set;
4. ``reject(body)`` returns a status: that status (e.g. 422, a permanent refusal);
5. the key was accepted before: 200 and counted as a duplicate (idempotent: nothing applied);
6. otherwise the body is accepted under its key: 200.

Every request is recorded (:attr:`WebhookReceiver.requests`); ``GET /_stats`` answers the counts.
``python -m refold.deploy.simulators.webhook_receiver --port 8080 --fail-every 5`` runs one in the
foreground (its own process: a receiver sharing a GIL with a dispatcher slows both).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ReceivedRequest", "WebhookReceiver", "main"]

# Connections queued before accept(): the dispatcher opens up to its concurrency at once.
_BACKLOG = 128


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request as the receiver saw it.

    Attributes:
        key: Its ``Idempotency-Key`` (``None`` if it had none).
        status: What the receiver answered.
        duplicate: The key had been accepted before.
        headers: The request headers (lower-case names).
        body: The parsed JSON body (``None`` if it was not JSON).
        at: ``time.monotonic()`` when it arrived.
    """

    key: str | None
    status: int
    duplicate: bool
    headers: dict[str, str]
    body: Any
    at: float


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = _BACKLOG

    def __init__(self, address: tuple[str, int], receiver: WebhookReceiver) -> None:
        self.receiver = receiver
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Silent: a connection cut by :meth:`WebhookReceiver.down` is expected."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real receivers
    # The headers and the body go out in two writes; with Nagle's algorithm the body waits for
    # the client's delayed ACK of the headers (~40 ms a request).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.receiver._track(self.connection, add=True)  # noqa: SLF001 - own server

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.receiver._track(self.connection, add=False)  # noqa: SLF001

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the receiver records requests itself."""

    def do_GET(self) -> None:
        """``GET /_stats``: :meth:`WebhookReceiver.snapshot` as JSON (for a receiver process)."""
        found = self.path.rstrip("/") == "/_stats"
        body = json.dumps(self.server.receiver.snapshot() if found else {}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        """Handle one delivery (see the module docstring)."""
        receiver = self.server.receiver
        receiver._busy(+1)  # noqa: SLF001 - own server
        try:
            self._post()
        finally:
            receiver._busy(-1)  # noqa: SLF001

    def _post(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if len(body) < length:  # the client went away mid-request: nothing to answer
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra = self.server.receiver._answer(headers, body)  # noqa: SLF001
        payload = json.dumps({"status": status}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class WebhookReceiver:
    """A local HTTP receiver of webhooks (see the module docstring).

    Args:
        port: Port to listen on (0: a free one, kept across :meth:`down`/:meth:`up`).
        path: The path of :attr:`url` (any path is served).
        fail_every: Answer ``fail_status`` to every n-th request (0: never).
        failure_rate: Answer ``fail_status`` with this probability (seeded: repeatable).
        fail_status: The status of a failure (503).
        retry_after: A ``Retry-After`` value sent with failures, if any.
        seed: Seed of the failure generator.
        delay_s: Wait this long before answering each request (a slow receiver).
        reject: Called with each JSON body; a status it returns is answered instead of
            accepting (permanent refusals, e.g. 422).
        signing_secret: Verify Standard Webhooks signatures with this secret (``whsec_...``
            or plain text); unsigned or badly signed requests get 401.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        path: str = "/hooks",
        fail_every: int = 0,
        failure_rate: float = 0.0,
        fail_status: int = 503,
        retry_after: str | None = None,
        seed: int = 0,
        delay_s: float = 0.0,
        reject: Callable[[Any], int | None] | None = None,
        signing_secret: str | None = None,
    ) -> None:
        self.port = port
        self.path = path
        self.fail_every = fail_every
        self.failure_rate = failure_rate
        self.fail_status = fail_status
        self.retry_after = retry_after
        self.delay_s = delay_s
        self.reject = reject
        self.signing_secret = signing_secret
        self.accepted: dict[str, Any] = {}
        self.requests: list[ReceivedRequest] = []
        self.duplicates = 0
        self._count = 0
        self._in_progress = 0
        self._first_at: float | None = None  # wall clock of the first and last acceptance
        self._last_at: float | None = None
        self._random = random.Random(seed)  # noqa: S311 - simulated failures, not security
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Where to POST."""
        return f"http://127.0.0.1:{self.port}{self.path}"

    @property
    def is_up(self) -> bool:
        """True while it listens."""
        return self._server is not None

    def start(self) -> WebhookReceiver:
        """Listen (on :attr:`port`; a free one the first time when 0) in a background thread."""
        return self.up()

    def up(self) -> WebhookReceiver:
        """Listen again after :meth:`down` (same port); no-op when up."""
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", self.port), self)
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"webhook receiver :{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def down(self) -> None:
        """An outage: stop listening and cut open connections (clients get refused/reset)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stop(self) -> None:
        """Stop for good (same as :meth:`down`)."""
        self.down()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- behaviour -------------------------------------------------------------------------

    def set_failures(
        self, *, fail_every: int | None = None, failure_rate: float | None = None
    ) -> None:
        """Change the failure plan while running."""
        with self._lock:
            if fail_every is not None:
                self.fail_every = fail_every
            if failure_rate is not None:
                self.failure_rate = failure_rate

    def snapshot(self) -> dict[str, Any]:
        """Counts so far: requests, accepted (unique keys), duplicates, answers by status.

        Also ``first_at``/``last_at``: when the first and the last key were accepted (epoch s).
        """
        with self._lock:
            by_status: dict[int, int] = {}
            for request in self.requests:
                by_status[request.status] = by_status.get(request.status, 0) + 1
            return {
                "requests": len(self.requests),
                "accepted": len(self.accepted),
                "duplicates": self.duplicates,
                "by_status": by_status,
                "first_at": self._first_at,
                "last_at": self._last_at,
            }

    def keys_seen(self) -> dict[str, int]:
        """How many requests came with each ``Idempotency-Key`` (any answer)."""
        with self._lock:
            seen: dict[str, int] = {}
            for request in self.requests:
                if request.key is not None:
                    seen[request.key] = seen.get(request.key, 0) + 1
            return seen

    @property
    def in_progress(self) -> int:
        """Requests being handled right now (e.g. waiting out ``delay_s``)."""
        with self._lock:
            return self._in_progress

    def _busy(self, change: int) -> None:
        with self._lock:
            self._in_progress += change

    def _track(self, connection: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def _verified(self, headers: dict[str, str], body: bytes) -> bool:
        if self.signing_secret is None:
            return True
        secret = self.signing_secret
        key = (
            base64.b64decode(secret[len("whsec_") :])
            if secret.startswith("whsec_")
            else secret.encode()
        )
        message_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
            return False  # missing, or too old: a replayed request
        signed = f"{message_id}.{timestamp}.".encode() + body
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
        return any(hmac.compare_digest(expected, g) for g in given)

    def _answer(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        """Decide the status of one request and record it (called by the handler threads)."""
        if self.delay_s:
            time.sleep(self.delay_s)
        key = headers.get("idempotency-key")
        try:
            document = json.loads(body) if body else None
        except ValueError:
            document = None
        extra: dict[str, str] = {}
        duplicate = False
        with self._lock:
            self._count += 1
            if not self._verified(headers, body):
                status = 401
            elif key is None or document is None:
                status = 400
            elif (self.fail_every and self._count % self.fail_every == 0) or (
                self.failure_rate and self._random.random() < self.failure_rate
            ):
                status = self.fail_status
                if self.retry_after is not None:
                    extra["Retry-After"] = self.retry_after
            elif self.reject is not None and (refused := self.reject(document)) is not None:
                status = refused
            elif key in self.accepted:
                status, duplicate = 200, True
                self.duplicates += 1
            else:
                status = 200
                self.accepted[key] = document
                self._last_at = time.time()
                self._first_at = self._first_at or self._last_at
            self.requests.append(
                ReceivedRequest(key, status, duplicate, headers, document, time.monotonic())
            )
        return status, extra


def main(argv: list[str] | None = None) -> int:
    """Run a receiver in the foreground and print its counts every few seconds."""
    parser = argparse.ArgumentParser(
        prog="python -m refold.deploy.simulators.webhook_receiver",
        description="A local webhook receiver: deduplicates on Idempotency-Key, fails on purpose.",
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--fail-every", type=int, default=0, help="503 on every n-th request")
    parser.add_argument("--failure-rate", type=float, default=0.0, help="503 with this probability")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signing-secret", help="verify Standard Webhooks signatures")
    parser.add_argument("--quiet", action="store_true", help="no counts every 5 s")
    args = parser.parse_args(argv)
    receiver = WebhookReceiver(
        port=args.port,
        fail_every=args.fail_every,
        failure_rate=args.failure_rate,
        seed=args.seed,
        signing_secret=args.signing_secret,
    ).start()
    print(f"listening on {receiver.url} (GET /_stats: counts; Ctrl-C stops)", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(5)
            if not args.quiet:
                print(json.dumps(receiver.snapshot()), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
