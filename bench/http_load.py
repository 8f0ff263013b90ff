"""Closed-loop HTTP/1.1 load, and the server processes it measures (``bench/serving.py``).

The generator is an asyncio ``Protocol`` per keep-alive connection, on uvloop when installed:
each connection sends its next pre-encoded request as soon as the answer is in, and parses only
the status line and ``content-length``. A few tens of microseconds per request, so one process
drives ~50k requests/s on this machine (against a server that answers at once): Python HTTP
clients (httpx) manage ~1-2k.

Servers run as ``python -m <target> --host 127.0.0.1 --port P --workers N`` (uvicorn's options)
in a process of their own; :meth:`Server.cpu_s` reads their CPU from ``/proc`` (Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx

from refold.deploy.local_stack import free_port

__all__ = ["Load", "Server", "cpu_seconds", "get_request", "post_request", "run_load", "serve"]

_T = TypeVar("_T")


@dataclass(slots=True)
class Load:
    """What a measurement's connections saw: latencies of 200 answers, the others by status."""

    deadline: float
    max_requests: int
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    last_at: float = 0.0


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection sending requests one after another (closed loop).

    Parses only what it needs: the status line and ``content-length`` (refold's answers are
    never chunked). Requests are pre-encoded bytes; ``done`` resolves when the connection stops
    (deadline, request budget, or a failure).
    """

    def __init__(
        self,
        requests: Sequence[bytes],
        first: int,
        tally: Load,
        answered: asyncio.Future[None],
        done: asyncio.Future[None],
    ) -> None:
        self._requests = requests
        self._answered = answered
        self._next = first
        self._tally = tally
        self._done = done
        self._buffer = bytearray()
        self._need = -1  # bytes of the whole answer once its head is in, else -1
        self._status = 0
        self._sent_at = 0.0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._send()

    def _send(self) -> None:
        tally, transport = self._tally, self._transport
        assert transport is not None  # noqa: S101 - only called once connected
        if time.perf_counter() >= tally.deadline or tally.sent >= tally.max_requests:
            transport.close()
            return
        tally.sent += 1
        request = self._requests[self._next % len(self._requests)]
        self._next += 1
        self._sent_at = time.perf_counter()
        transport.write(request)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            if self._need < 0:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buffer[:end]).lower()
                self._status = int(head[9:12])
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    self._fail("answer without content-length")
                    return
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else len(head)])
                self._need = end + 4 + length
            if len(buffer) < self._need:
                return
            now = time.perf_counter()
            del buffer[: self._need]
            self._need = -1
            if self._status == 200:
                self._tally.latencies.append(now - self._sent_at)
            else:
                self._tally.errors[str(self._status)] += 1
            self._tally.last_at = now
            if not self._answered.done():
                self._answered.set_result(None)
            self._send()

    def _fail(self, why: str) -> None:
        self._tally.errors[why] += 1
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._tally.errors[type(exc).__name__] += 1
        for future in (self._answered, self._done):
            if not future.done():
                future.set_result(None)


async def _drive(
    port: int, requests: Sequence[bytes], connections: int, seconds: float, max_requests: int
) -> tuple[Load, float]:
    """Run ``connections`` closed-loop connections for ``seconds``; the tally and its length."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    tally = Load(started + seconds, max_requests)
    done: list[asyncio.Future[None]] = []
    spread = max(1, len(requests) // connections)
    for index in range(connections):
        answered: asyncio.Future[None] = loop.create_future()
        done.append(loop.create_future())
        await loop.create_connection(
            functools.partial(_Connection, requests, index * spread, tally, answered, done[-1]),
            "127.0.0.1",
            port,
        )
        # One connection at a time, each once the previous one had its first answer: opened
        # in a burst, they would all be accepted by whichever uvicorn worker wakes first.
        await asyncio.wait_for(answered, 30)
    # Bounded even if a connection hangs (a wedged server): the deadline plus a margin.
    await asyncio.wait_for(asyncio.gather(*done), seconds + 30)
    return tally, (tally.last_at or time.perf_counter()) - started


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on uvloop (as the server does) when it is installed, else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_load(
    port: int, requests: Sequence[bytes], *, connections: int, seconds: float, max_requests: int
) -> tuple[Load, float]:
    """``connections`` closed-loop connections cycling ``requests`` for ``seconds``.

    Returns:
        What they saw, and the measurement's length (to the last answer).
    """
    return _run(_drive(port, requests, connections, seconds, max_requests))


def get_request(path: str, api_key: str) -> bytes:
    """A pre-encoded keep-alive GET carrying an API key."""
    return (
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {api_key}\r\n\r\n"
    ).encode()


def post_request(path: str, api_key: str, body: bytes) -> bytes:
    """A pre-encoded keep-alive POST of a JSON ``body`` carrying an API key."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and its children, from ``/proc`` (Linux)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # fields[1]: parent pid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


@dataclass(frozen=True, slots=True)
class Server:
    """A running server: its port and process (uvicorn's workers are its children)."""

    port: int
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds its processes have used so far."""
        return cpu_seconds(self.pid)


@contextlib.contextmanager
def serve(target: Sequence[str], env: dict[str, str], workers: int, log: Path) -> Iterator[Server]:
    """An HTTP server process (``python -m <target...> --port P``) until the block ends."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        *target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).is_success:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                msg = f"{' '.join(target)} did not start; its log ends with:\n{tail}"
                raise RuntimeError(msg)
            time.sleep(0.1)
        yield Server(port, process.pid)
    finally:
        process.terminate()  # uvicorn stops its workers on SIGTERM
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
