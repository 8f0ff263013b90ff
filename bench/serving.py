"""The HTTP services under load: single-key reads against Redis, batched ingest against the SDK.

``python -m bench serving [--orders 10000] [--seconds 10] [--workers 1,2] [--batches 500,1000]``.
On a private local stack (Tansu + redis-server), with ``refold serve`` (``deploy.serve_cli``,
uvicorn with uvloop and httptools) in a process of its own, API keys on (``REFOLD_SERVE__AUTH=
keys``, one key with the ingest and query scopes, as users run it), in one run:

1. **query**: ``GET /v1/processors/order_state/tables/orders/entities/{key}`` over keep-alive
   connections, against ``StateReader.get`` of the same keys with redis-py (one sequential loop
   per process, the client processes as many as the server's workers). The state: ``--orders``
   orders published with the producer SDK and folded by ``FoldWriter`` (the processor's own
   envelope) into a live generation, so keys, values and positions are the processor's.
2. **ingest**: ``POST /v1/events`` with batches of ``--batches`` events (order events of the
   simulator, as JSON), against ``EventPublisher.emit_many`` on the same batches.

Each row is run at 1 and 2 server workers (``--workers``), and the Redis and SDK baselines with
as many client processes. Every measurement is bounded by ``--seconds`` and a count, after a
warm-up. The load generator is an asyncio ``Protocol`` over raw HTTP/1.1 (closed loop: each
connection sends its next request when the answer is in), on uvloop, in this process: it shares
the machine's cores with the server, as noted in the table. ``GET /health/live`` (no Redis, no
key) is measured too, as the ceiling of server and generator together.

Prints a table, writes ``bench/results/serving.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import httpx
import orjson
import redis

from contracts.commerce import ORDERS
from contracts.kafka.admin import ensure_topics
from contracts.layout import StateLayout
from contracts.settings import KafkaSettings
from contracts.store.generations import GenerationRegistry
from contracts.topics import TopicSpec
from deploy.local_stack import LocalStack, free_port
from deploy.simulators.orders import OrderSimulator, SimulatedEvent
from processors.fold.oracle import fold_all
from processors.fold.records import SourceRecord
from processors.order_state.projection import OrderStateProjection
from processors.runtime.envelope import FoldTarget, FoldWriter
from processors.runtime.kafka_ranges import read_log
from services.auth import ApiKeyStore
from services.producer.publisher import EventPublisher
from services.reader.state_reader import StateReader

__all__ = ["RESULTS", "Measured", "main"]

RESULTS = Path(__file__).parent / "results" / "serving.json"
PREFIX = "bench-serving"
PROCESSOR, TABLE = "order_state", "orders"
DLQ = TopicSpec(f"{ORDERS.name}.dlq", 1, "(key)", ("(any)",))
# Warm-up before each measurement: both workers' lazy clients (Redis pool, Kafka producer,
# the key's first lookup), CPython's caches.
_WARM_UP_S = 1.5
# Query connections per server worker: enough to keep a worker busy while the generator runs
# (closed loop), few enough that queueing does not dominate the latency.
_QUERY_CONNECTIONS = 8
# Ingest connections per worker: a worker publishes one request at a time (its producer is
# shared), so a second connection only overlaps parsing and validation with the wait.
_INGEST_CONNECTIONS = 2
# Most requests of one measurement, besides --seconds (bounds a broker that keeps every event in
# memory: about 300 MB per million order events).
_MAX_QUERY_REQUESTS = 2_000_000
_MAX_INGEST_EVENTS = 400_000
_T = TypeVar("_T")

Kind = Literal["query", "ingest", "ceiling"]


@dataclass(frozen=True, slots=True)
class Measured:
    """One measurement: requests answered in a time, their items and latencies.

    Attributes:
        kind: ``query``, ``ingest`` or ``ceiling`` (``/health/live``).
        label: What ran.
        processes: Server workers, or client processes of a baseline.
        connections: HTTP connections (0 for a baseline).
        batch: Items per request (events of an ingest batch; 1 for a read).
        requests: Requests answered in the measurement.
        items: Reads or events among them answered with 200.
        errors: Requests answered otherwise (by status), or failed.
        seconds: The measurement's length.
        p50_ms: Median request latency.
        p99_ms: 99th percentile request latency.
    """

    kind: Kind
    label: str
    processes: int
    connections: int
    batch: int
    requests: int
    items: int
    errors: dict[str, int]
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        """Items (reads or events) per second."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-ready fields, with the rate."""
        return {**asdict(self), "rate": self.rate}


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` in ms (nearest rank; 0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _measured(
    kind: Kind,
    label: str,
    processes: int,
    connections: int,
    batch: int,
    latencies: Sequence[float],
    items: int,
    errors: Counter[str],
    seconds: float,
) -> Measured:
    return Measured(
        kind,
        label,
        processes,
        connections,
        batch,
        len(latencies) + sum(errors.values()),
        items,
        dict(errors),
        seconds,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.99),
    )


# --- the load generator -------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    """What a measurement's connections saw."""

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
        self, requests: Sequence[bytes], first: int, tally: _Tally, done: asyncio.Future[None]
    ) -> None:
        self._requests = requests
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
            self._send()

    def _fail(self, why: str) -> None:
        self._tally.errors[why] += 1
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._tally.errors[type(exc).__name__] += 1
        if not self._done.done():
            self._done.set_result(None)


async def _drive(
    port: int, requests: Sequence[bytes], connections: int, seconds: float, max_requests: int
) -> tuple[_Tally, float]:
    """Run ``connections`` closed-loop connections for ``seconds``; the tally and its length."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    tally = _Tally(started + seconds, max_requests)
    done: list[asyncio.Future[None]] = []
    spread = max(1, len(requests) // connections)
    for index in range(connections):
        future: asyncio.Future[None] = loop.create_future()
        done.append(future)
        await loop.create_connection(
            lambda i=index, f=future: _Connection(requests, i * spread, tally, f),  # type: ignore[misc]
            "127.0.0.1",
            port,
        )
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


def _load(
    kind: Kind,
    label: str,
    workers: int,
    port: int,
    requests: Sequence[bytes],
    *,
    batch: int,
    connections: int,
    seconds: float,
    max_requests: int,
) -> Measured:
    """Warm up, then measure ``requests`` (cycled) against the server on ``port``."""
    _run(_drive(port, requests, connections, _WARM_UP_S, max_requests))
    tally, elapsed = _run(_drive(port, requests, connections, seconds, max_requests))
    return _measured(
        kind,
        label,
        workers,
        connections,
        batch,
        tally.latencies,
        len(tally.latencies) * batch,
        tally.errors,
        elapsed,
    )


def _get(path: str, api_key: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {api_key}\r\n\r\n"
    ).encode()


def _post(path: str, api_key: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- the server ----------------------------------------------------------------------------


@contextlib.contextmanager
def _server(stack: LocalStack, state: Path, workers: int, log_level: str) -> Iterator[int]:
    """``refold serve`` with ``workers`` workers on a free port; yields the port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFOLD_")}
    env.update(
        {
            "REFOLD_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            "REFOLD_REDIS__URL": stack.redis_url,
            "REFOLD_REDIS__KEY_PREFIX": PREFIX,
            "REFOLD_STATE_DIR": str(state),
        }
    )
    argv = [
        sys.executable,
        "-m",
        "deploy.serve_cli",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--auth",
        "keys",
        "--log-level",
        log_level,
    ]
    log = state / f"serve-{workers}-{port}.log"
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
                msg = f"refold serve did not start; its log ends with:\n{tail}"
                raise RuntimeError(msg)
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# --- the baselines (each in processes of their own) -----------------------------------------


def _direct_reads(
    url: str, keys: Sequence[str], first: int, seconds: float
) -> tuple[list[float], int, float]:
    """``StateReader.get`` of ``keys`` in a loop for ``seconds``: latencies, misses, length."""
    reader = StateReader(redis.Redis.from_url(url), PROCESSOR, PREFIX)
    latencies: list[float] = []
    missing, elapsed = 0, 0.0
    for length in (_WARM_UP_S, seconds):
        latencies.clear()
        missing, index = 0, first
        began = time.perf_counter()
        deadline = began + length
        while time.perf_counter() < deadline and len(latencies) < _MAX_QUERY_REQUESTS:
            started = time.perf_counter()
            view = reader.get(TABLE, keys[index % len(keys)])
            latencies.append(time.perf_counter() - started)
            missing += view.value is None
            index += 1
        elapsed = time.perf_counter() - began
    return latencies, missing, elapsed


def _sdk_ingest(
    bootstrap: str, batches: Sequence[Sequence[SimulatedEvent]], first: int, seconds: float
) -> tuple[list[float], int, float]:
    """``EventPublisher.emit_many`` of ``batches`` in a loop: latencies, events, length."""
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=bootstrap))
    latencies: list[float] = []
    events, elapsed = 0, 0.0
    try:
        for length in (_WARM_UP_S, seconds):
            latencies.clear()
            events, index = 0, first
            began = time.perf_counter()
            deadline = began + length
            while time.perf_counter() < deadline and events < _MAX_INGEST_EVENTS:
                batch = batches[index % len(batches)]
                started = time.perf_counter()
                publisher.emit_many(batch)
                latencies.append(time.perf_counter() - started)
                events += len(batch)
                index += 1
            elapsed = time.perf_counter() - began
    finally:
        publisher.close()
    return latencies, events, elapsed


def _in_processes(
    processes: int, work: Callable[..., tuple[list[float], int, float]], data: Any, seconds: float
) -> tuple[list[float], int, float]:
    """``work(url, data, first, seconds)`` in ``processes`` spawned processes at once.

    Returns:
        Every process's latencies, the sum of their counts, the longest of their lengths.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [pool.submit(work, *data, i * 7919, seconds) for i in range(processes)]
        results = [f.result() for f in futures]
    latencies = [x for r in results for x in r[0]]
    return latencies, sum(r[1] for r in results), max(r[2] for r in results)


def _direct(url: str, keys: Sequence[str], processes: int, seconds: float) -> Measured:
    latencies, missing, elapsed = _in_processes(processes, _direct_reads, (url, keys), seconds)
    errors = Counter({"missing": missing}) if missing else Counter[str]()
    label = f"Redis direct: StateReader.get, {processes} process" + "es" * (processes > 1)
    return _measured("query", label, processes, 0, 1, latencies, len(latencies), errors, elapsed)


def _sdk(
    bootstrap: str, batches: Sequence[Sequence[SimulatedEvent]], processes: int, seconds: float
) -> Measured:
    latencies, events, elapsed = _in_processes(
        processes, _sdk_ingest, (bootstrap, batches), seconds
    )
    size = len(batches[0])
    label = f"SDK: emit_many({size}), {processes} process" + "es" * (processes > 1)
    return _measured("ingest", label, processes, 0, size, latencies, events, Counter(), elapsed)


# --- preparation ---------------------------------------------------------------------------


def _prepare_state(stack: LocalStack, orders: int) -> tuple[list[str], dict[str, Any]]:
    """``orders`` orders published, folded by FoldWriter into a live generation; their keys."""
    kafka = {"bootstrap.servers": stack.bootstrap_servers}
    events = list(OrderSimulator(orders, seed=12, order_prefix="q-"))
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap_servers))
    publisher.emit_many(events)
    publisher.close()
    client = redis.Redis.from_url(stack.redis_url)
    registry = GenerationRegistry(client, StateLayout(PROCESSOR, PREFIX))
    generation = registry.create({"topics": [ORDERS.name]}, live=True)
    target = FoldTarget(
        PROCESSOR, generation, stack.redis_url, PREFIX, tuple(kafka.items()), DLQ.name
    )
    records = [SourceRecord.of_message(m) for chunk in read_log(kafka, ORDERS.name) for m in chunk]
    FoldWriter(target, OrderStateProjection()).apply(records, batch_id=1)
    states = fold_all(OrderStateProjection(), events).states
    client.close()
    return sorted(states), states


def _check(port: int, api_key: str, key: str, wanted: Any) -> None:
    """The server answers ``key`` with the oracle's state (the benchmark reads real data)."""
    path = f"/v1/processors/{PROCESSOR}/tables/{TABLE}/entities/{key}"
    answer = httpx.get(
        f"http://127.0.0.1:{port}{path}",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    if answer.status_code != 200 or answer.json()["value"] != wanted:
        msg = f"GET {path} answered {answer.status_code}: {answer.text[:500]}"
        raise RuntimeError(msg)


def _ingest_bodies(batch: int, count: int) -> list[list[SimulatedEvent]]:
    """``count`` batches of ``batch`` order events each (a fresh prefix: new orders)."""
    events = list(OrderSimulator(batch * count // 4 + 1, seed=34, order_prefix="i-"))
    while len(events) < batch * count:
        events += events
    return [events[i * batch : (i + 1) * batch] for i in range(count)]


# --- the table -----------------------------------------------------------------------------


def _table(rows: Sequence[Measured], orders: int) -> str:
    base = {(r.kind, r.processes, r.batch): r.rate for r in rows if r.connections == 0}
    lines = [
        f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {orders:,} orders "
        "in Redis; auth on (API key)",
        f"{'run':<52} {'items/s':>9} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'errors':>7} "
        f"{'vs base':>8}",
    ]
    for r in rows:
        ratio = base.get((r.kind, r.processes, r.batch)) if r.connections else None
        versus = f"{r.rate / ratio:.0%}" if ratio else ""
        errors = sum(r.errors.values())
        lines.append(
            f"{r.label:<52} {r.rate:>9,.0f} {r.requests / r.seconds:>8,.0f} {r.p50_ms:>7.2f} "
            f"{r.p99_ms:>7.2f} {errors:>7} {versus:>8}"
        )
    lines += [
        "notes: the load generator (asyncio, raw HTTP/1.1, closed loop, uvloop) runs in the",
        "bench process on the same cores as the server and Redis (and Tansu for ingest);",
        "'vs base' compares with the direct row of the same process count (query: StateReader",
        "over redis-py; ingest: the producer SDK). Targets: query >= 10k reads/s, p99 < 10 ms;",
        "ingest >= 20k events/s.",
    ]
    return "\n".join(lines)


def _progress(row: Measured) -> None:
    print(
        f"  {row.label}: {row.rate:,.0f}/s, p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms"
        + (f", errors {row.errors}" if row.errors else ""),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench serving``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--orders", type=int, default=10_000, help="orders in Redis to read")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    parser.add_argument("--workers", default="1,2", help="server workers (default 1,2)")
    parser.add_argument("--batches", default="500,1000", help="ingest batch sizes")
    parser.add_argument(
        "--log-level",
        default="warning",
        help="the server's uvicorn log level (info logs every request: the access log)",
    )
    parser.add_argument("--skip-query", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args(argv)
    levels = [int(w) for w in args.workers.split(",") if w.strip()]
    sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    rows: list[Measured] = []
    with (
        tempfile.TemporaryDirectory(prefix="refold-bench-serving-") as tmp,
        LocalStack(Path(tmp) / "stack", free_port(), free_port()) as stack,
    ):
        state = Path(tmp)
        ensure_topics({"bootstrap.servers": stack.bootstrap_servers}, [ORDERS, DLQ])
        keys, states = _prepare_state(stack, args.orders)
        print(f"{len(keys):,} orders folded into {PROCESSOR} (live generation)", flush=True)
        client = redis.Redis.from_url(stack.redis_url)
        api_key = ApiKeyStore(client, PREFIX).add("bench", ["ingest", "query"])
        client.close()
        reads = [
            _get(f"/v1/processors/{PROCESSOR}/tables/{TABLE}/entities/{k}", api_key) for k in keys
        ]
        live = [_get("/health/live", api_key)]
        bodies = {
            size: [
                _post(
                    "/v1/events",
                    api_key,
                    orjson.dumps({"events": [{"type": t, "event": e} for t, e in batch]}),
                )
                for batch in _ingest_bodies(size, 8)
            ]
            for size in sizes
        }
        for workers in levels:
            if not args.skip_query:
                rows.append(_direct(stack.redis_url, keys, workers, args.seconds))
                _progress(rows[-1])
            if not args.skip_ingest:
                for size in sizes:
                    rows.append(
                        _sdk(
                            stack.bootstrap_servers, _ingest_bodies(size, 8), workers, args.seconds
                        )
                    )
                    _progress(rows[-1])
            with _server(stack, state, workers, args.log_level) as port:
                _check(port, api_key, keys[0], states[keys[0]])
                worker_s = f"{workers} worker" + "s" * (workers > 1)
                rows.append(
                    _load(
                        "ceiling",
                        f"HTTP GET /health/live, {worker_s}",
                        workers,
                        port,
                        live,
                        batch=1,
                        connections=_QUERY_CONNECTIONS * workers,
                        seconds=min(args.seconds, 5.0),
                        max_requests=_MAX_QUERY_REQUESTS,
                    )
                )
                _progress(rows[-1])
                if not args.skip_query:
                    connections = _QUERY_CONNECTIONS * workers
                    rows.append(
                        _load(
                            "query",
                            f"HTTP GET entity, {worker_s}, {connections} conns",
                            workers,
                            port,
                            reads,
                            batch=1,
                            connections=connections,
                            seconds=args.seconds,
                            max_requests=_MAX_QUERY_REQUESTS,
                        )
                    )
                    _progress(rows[-1])
                if not args.skip_ingest:
                    for size in sizes:
                        connections = _INGEST_CONNECTIONS * workers
                        rows.append(
                            _load(
                                "ingest",
                                f"HTTP POST /v1/events ({size}), {worker_s}, {connections} conns",
                                workers,
                                port,
                                bodies[size],
                                batch=size,
                                connections=connections,
                                seconds=args.seconds,
                                max_requests=_MAX_INGEST_EVENTS // size,
                            )
                        )
                        _progress(rows[-1])
    rows.sort(
        key=lambda r: (
            {"query": 0, "ingest": 1, "ceiling": 2}[r.kind],
            r.batch,
            r.processes,
            r.connections,
        )
    )
    table = _table(rows, len(keys))
    print("\n" + table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "orders": len(keys),
                "cores": os.cpu_count(),
                "seconds": args.seconds,
                "log_level": args.log_level,
                "runs": [r.as_json() for r in rows],
            },
            indent=2,
        )
    )
    print(f"\nresults written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
