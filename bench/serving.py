"""The HTTP services under load: single-key reads against Redis, batched ingest against the SDK.

``python -m bench serving [--orders 10000] [--seconds 10] [--workers 1,2] [--batches 500,1000]``. On
a private local stack (Apache Kafka + redis-server), with ``refold serve``
(``refold.deploy.serve_cli``, uvicorn with uvloop and httptools) in a process of its own, as users
run it: API keys on (``--auth keys``, one key with the ingest and query scopes), log level info,
uvicorn's access log off (its default; ``--access-log`` turns it on). In one run:

1. **query**: ``GET /v1/processors/order_state/tables/orders/entities/{key}`` over keep-alive
   connections, against ``StateReader.get`` of the same keys with redis-py (one sequential loop
   per process, the client processes as many as the server's workers). The state: ``--orders``
   orders published with the producer SDK and folded by ``FoldWriter`` (the processor's own
   envelope) into a live generation, so keys, values and positions are the processor's.
2. **ingest**: ``POST /v1/events`` with batches of ``--batches`` events (order events of the
   simulator, as JSON), against ``EventPublisher.emit_many`` on the same batches.

Each row is run at 1 and 2 server workers (``--workers``), and the Redis and SDK baselines with
as many client processes. Every measurement is bounded by ``--seconds`` and a count, after a
warm-up. The load generator (:mod:`bench.http_load`) is an asyncio ``Protocol`` over raw
keep-alive HTTP/1.1 (closed loop: each connection sends its next request when the answer is
in), on uvloop, in this process: it shares the machine's cores with the server, as the table
notes, and the server's CPU per item is reported beside the rates. A bare FastAPI route (no key, no
Redis: :func:`bare_app`) under the same uvicorn is measured too: the ceiling of server and
generator together on this machine.

Prints a table, writes ``bench/results/serving.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import orjson
from fastapi import FastAPI, Response

from bench.http_load import Server, get_request, post_request, run_load, serve
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.simulators.orders import OrderSimulator, SimulatedEvent
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import (
    DEFAULT_NOTIFICATIONS_TOPIC,
    OrderStateProjection,
)
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.auth import ApiKeyStore
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader

__all__ = ["RESULTS", "Measured", "bare_app", "main"]

RESULTS = Path(__file__).parent / "results" / "serving.json"
PREFIX = "bench-serving"
PROCESSOR, TABLE = "order_state", "orders"
DLQ = TopicSpec(f"{ORDERS.name}.dlq", 1, "(key)", ("(any)",))
# Where the fold's shipping notices go (its side effects): the broker creates no topic.
NOTICES = TopicSpec(DEFAULT_NOTIFICATIONS_TOPIC, 1, "order_id", ("(json)",))
# Warm-up before each measurement: both workers' lazy clients (Redis pool, Kafka producer,
# the key's first lookup), CPython's caches.
_WARM_UP_S = 1.5
# Query connections per server worker: a worker is CPU-bound from 2-4 connections here; more
# only queue in it and add to the latency (closed loop: latency ~ connections / rate).
_QUERY_CONNECTIONS = 4
# The reads come from this many API keys (clients), in turn: each stays under the default query
# limit (10000/second a key), which one key alone reaches at two workers' rate.
_READ_KEYS = 4
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
        kind: ``query``, ``ingest`` or ``ceiling`` (the bare FastAPI route).
        label: What ran.
        processes: Server workers, or client processes of a baseline.
        connections: HTTP connections (0 for a baseline).
        batch: Items per request (events of an ingest batch; 1 for a read).
        requests: Requests answered in the measurement.
        items: Reads or events among them answered with 200.
        errors: Requests answered otherwise (by status), or failed.
        seconds: The measurement's length.
        cpu_s: CPU time of the serving side meanwhile: the server's processes (HTTP rows), the
            client processes (baselines). Shows how busy the workers were, and the cost of an
            item independently of what else ran on the machine.
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
    cpu_s: float
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        """Items (reads or events) per second."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us(self) -> float:
        """CPU microseconds of the serving side per item."""
        return self.cpu_s / self.items * 1e6 if self.items else 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-ready fields, with the rate and the CPU per item."""
        return {**asdict(self), "rate": self.rate, "cpu_us_per_item": self.cpu_us}


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
    cpu_s: float,
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
        cpu_s,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.99),
    )


def _load(
    kind: Kind,
    label: str,
    workers: int,
    server: Server,
    requests: Sequence[bytes],
    *,
    batch: int,
    connections: int,
    seconds: float,
    max_requests: int,
) -> Measured:
    """Warm up, then measure ``requests`` (cycled) against ``server``."""
    options = {"connections": connections, "max_requests": max_requests}
    run_load(server.port, requests, seconds=_WARM_UP_S, **options)
    cpu = server.cpu_s()
    tally, elapsed = run_load(server.port, requests, seconds=seconds, **options)
    cpu = server.cpu_s() - cpu
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
        cpu,
    )


# --- the server ----------------------------------------------------------------------------


def bare_app() -> FastAPI:
    """uvicorn's factory of the ceiling: FastAPI with one async route, no auth, no Redis."""
    app = FastAPI()

    @app.get("/bare/{key}")
    async def bare(key: str) -> Response:
        return Response(b'{"key": "-", "value": {}}', media_type="application/json")

    return app


def _refold_serve(
    stack: LocalStack, state: Path, workers: int, log_options: Sequence[str]
) -> contextlib.AbstractContextManager[Server]:
    """``refold serve`` on the private stack, API keys on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFOLD_")}
    env.update(
        {
            "REFOLD_KAFKA__BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            "REFOLD_REDIS__URL": stack.redis_url,
            "REFOLD_REDIS__KEY_PREFIX": PREFIX,
            "REFOLD_STATE_DIR": str(state),
        }
    )
    target = ["refold.deploy.serve_cli", "--auth", "keys", *log_options]
    return serve(target, env, workers, state / f"serve-{workers}.log")


def _bare_serve(state: Path, workers: int) -> contextlib.AbstractContextManager[Server]:
    """The ceiling's server (``bare_app``) under uvicorn, as ``refold serve`` runs it."""
    target = ["uvicorn", f"{__name__}:bare_app", "--factory", "--log-level", "warning"]
    return serve(target, dict(os.environ), workers, state / f"bare-{workers}.log")


# --- the baselines (each in processes of their own) -----------------------------------------


@dataclass(frozen=True, slots=True)
class _Sample:
    """What one baseline process measured (picklable: it comes back from a process)."""

    latencies: list[float]
    count: int  # misses (reads) or events sent (ingest)
    seconds: float
    cpu_s: float


def _direct_reads(url: str, keys: Sequence[str], first: int, seconds: float) -> _Sample:
    """``StateReader.get`` of ``keys`` in a loop for ``seconds`` (after a warm-up)."""
    reader = StateReader(redis_client(url), PROCESSOR, PREFIX)
    latencies: list[float] = []
    missing, index = 0, first
    for length in (_WARM_UP_S, seconds):
        latencies.clear()
        missing = 0
        began, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() < began + length and len(latencies) < _MAX_QUERY_REQUESTS:
            started = time.perf_counter()
            view = reader.get(TABLE, keys[index % len(keys)])
            latencies.append(time.perf_counter() - started)
            missing += view.value is None
            index += 1
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    return _Sample(latencies, missing, elapsed, cpu)


def _sdk_ingest(
    bootstrap: str, batches: Sequence[Sequence[SimulatedEvent]], first: int, seconds: float
) -> _Sample:
    """``EventPublisher.emit_many`` of ``batches`` in a loop for ``seconds`` (after a warm-up)."""
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=bootstrap))
    latencies: list[float] = []
    events, index = 0, first
    try:
        for length in (_WARM_UP_S, seconds):
            latencies.clear()
            events = 0
            began, cpu = time.perf_counter(), time.process_time()
            while time.perf_counter() < began + length and events < _MAX_INGEST_EVENTS:
                batch = batches[index % len(batches)]
                started = time.perf_counter()
                publisher.emit_many(batch)
                latencies.append(time.perf_counter() - started)
                events += len(batch)
                index += 1
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        publisher.close()
    return _Sample(latencies, events, elapsed, cpu)


def _in_processes(
    processes: int, work: Callable[..., _Sample], data: tuple[Any, ...], seconds: float
) -> _Sample:
    """``work(*data, first, seconds)`` in ``processes`` spawned processes at once, summed up.

    Returns:
        Every process's latencies, the sum of their counts and CPU, the longest length.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [pool.submit(work, *data, i * 7919, seconds) for i in range(processes)]
        samples = [f.result() for f in futures]
    return _Sample(
        [x for sample in samples for x in sample.latencies],
        sum(sample.count for sample in samples),
        max(sample.seconds for sample in samples),
        sum(sample.cpu_s for sample in samples),
    )


def _direct(url: str, keys: Sequence[str], processes: int, seconds: float) -> Measured:
    done = _in_processes(processes, _direct_reads, (url, keys), seconds)
    errors = Counter({"missing": done.count}) if done.count else Counter[str]()
    label = f"Redis direct: StateReader.get, {processes} process" + "es" * (processes > 1)
    return _measured(
        "query",
        label,
        processes,
        0,
        1,
        done.latencies,
        len(done.latencies),
        errors,
        done.seconds,
        done.cpu_s,
    )


def _sdk(
    bootstrap: str, batches: Sequence[Sequence[SimulatedEvent]], processes: int, seconds: float
) -> Measured:
    done = _in_processes(processes, _sdk_ingest, (bootstrap, batches), seconds)
    size = len(batches[0])
    label = f"SDK: emit_many({size}), {processes} process" + "es" * (processes > 1)
    return _measured(
        "ingest",
        label,
        processes,
        0,
        size,
        done.latencies,
        done.count,
        Counter(),
        done.seconds,
        done.cpu_s,
    )


# --- preparation ---------------------------------------------------------------------------


def _prepare_state(stack: LocalStack, orders: int) -> tuple[list[str], dict[str, Any]]:
    """``orders`` orders published, folded by FoldWriter into a live generation; their keys."""
    kafka = {"bootstrap.servers": stack.bootstrap_servers}
    events = list(OrderSimulator(orders, seed=12, anomaly_rate=0.0, order_prefix="q-"))
    publisher = EventPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap_servers))
    publisher.emit_many(events)
    publisher.close()
    client = redis_client(stack.redis_url)
    registry = GenerationRegistry.of(client, PROCESSOR, PREFIX)
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


def _table(rows: Sequence[Measured], orders: int, log_level: str, load: float) -> str:
    base = {(r.kind, r.processes, r.batch): r.rate for r in rows if r.connections == 0}
    lines = [
        f"machine: {os.cpu_count()} cores (load average {load:.2f} before the run), Python "
        f"{sys.version.split()[0]}; {orders:,} orders in Redis; refold serve with API keys "
        f"on, uvicorn log level {log_level}",
        f"{'run':<52} {'items/s':>8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'cores':>5} "
        f"{'CPU us/item':>11} {'err':>4} {'vs base':>7}",
    ]
    for r in rows:
        ratio = base.get((r.kind, r.processes, r.batch)) if r.connections else None
        versus = f"{r.rate / ratio:.0%}" if ratio else ""
        errors = sum(r.errors.values())
        cores = r.cpu_s / r.seconds if r.seconds else 0.0
        lines.append(
            f"{r.label:<52} {r.rate:>8,.0f} {r.requests / r.seconds:>7,.0f} {r.p50_ms:>7.2f} "
            f"{r.p99_ms:>7.2f} {cores:>5.2f} {r.cpu_us:>11,.1f} {errors:>4} {versus:>7}"
        )
    lines += [
        "items: reads (query) or events (ingest). vs base: items/s against the baseline with as",
        "many processes (query: StateReader.get over redis-py, one sequential loop per process;",
        "ingest: EventPublisher.emit_many of the same batches). cores, CPU us/item: CPU of the",
        "server's processes (HTTP rows) or of the client processes (baselines) meanwhile. The",
        "load generator (asyncio, raw keep-alive HTTP/1.1, closed loop, uvloop) runs in the",
        "bench process on the same cores as the server, redis-server and Kafka; it opens its",
        "connections one at a time so that uvicorn's workers share them. The bare FastAPI rows",
        f"are the ceiling of uvicorn + FastAPI + the generator here. Reads come from {_READ_KEYS}",
        "API keys in turn, each under the default query limit. Targets: query >= 10k reads/s",
        "with p99 < 10 ms (issue 12), >= 5k reads/s per worker with p99 < 5 ms (issue 23);",
        "ingest >= 20k events/s.",
    ]
    return "\n".join(lines)


def _progress(row: Measured) -> None:
    print(
        f"  {row.label}: {row.rate:,.0f}/s, p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms"
        + (f", errors {row.errors}" if row.errors else ""),
        flush=True,
    )


@dataclass(frozen=True, slots=True)
class _Setup:
    """What every measurement of a run shares."""

    stack: LocalStack
    state: Path
    seconds: float
    log_options: tuple[str, ...]  # refold serve's --log-level and --access-log
    keys: list[str]
    reads: list[bytes]
    bodies: dict[int, list[bytes]]
    events: dict[int, list[list[SimulatedEvent]]]


def _setup(stack: LocalStack, state: Path, args: argparse.Namespace) -> _Setup:
    """State to read, API keys, and every request pre-encoded."""
    ensure_topics({"bootstrap.servers": stack.bootstrap_servers}, [ORDERS, DLQ, NOTICES])
    keys, states = _prepare_state(stack, args.orders)
    print(f"{len(keys):,} orders folded into {PROCESSOR} (live generation)", flush=True)
    client = redis_client(stack.redis_url)
    store = ApiKeyStore(client, PREFIX)
    api_keys = [store.add(f"bench-{i}", ["ingest", "query"]) for i in range(_READ_KEYS)]
    api_key = api_keys[0]
    client.close()
    log_options = ("--log-level", args.log_level, *(["--access-log"] * args.access_log))
    # Checked once against the oracle: the benchmark reads the processor's real values.
    with _refold_serve(stack, state, 1, log_options) as server:
        _check(server.port, api_key, keys[0], states[keys[0]])
    sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    events = {size: _ingest_bodies(size, 8) for size in sizes}
    return _Setup(
        stack,
        state,
        args.seconds,
        log_options,
        keys,
        [
            get_request(
                f"/v1/processors/{PROCESSOR}/tables/{TABLE}/entities/{k}",
                api_keys[i % len(api_keys)],
            )
            for i, k in enumerate(keys)
        ],
        {
            size: [
                post_request(
                    "/v1/events",
                    api_key,
                    orjson.dumps({"events": [{"type": t, "event": e} for t, e in batch]}),
                )
                for batch in batches
            ]
            for size, batches in events.items()
        },
        events,
    )


def _workers(setup: _Setup, workers: int, query: bool, ingest: bool) -> Iterator[Measured]:
    """Every measurement at ``workers`` server workers (and as many baseline processes)."""
    seconds, named = setup.seconds, f"{workers} worker" + "s" * (workers > 1)
    if query:
        yield _direct(setup.stack.redis_url, setup.keys, workers, seconds)
    if ingest:
        for batches in setup.events.values():
            yield _sdk(setup.stack.bootstrap_servers, batches, workers, seconds)
    with _refold_serve(setup.stack, setup.state, workers, setup.log_options) as server:
        if query:
            connections = _QUERY_CONNECTIONS * workers
            label = f"HTTP GET entity, {named}, {connections} conns"
            yield _load(
                "query",
                label,
                workers,
                server,
                setup.reads,
                batch=1,
                connections=connections,
                seconds=seconds,
                max_requests=_MAX_QUERY_REQUESTS,
            )
        if ingest:
            for size, bodies in setup.bodies.items():
                connections = _INGEST_CONNECTIONS * workers
                label = f"HTTP POST /v1/events ({size}), {named}, {connections} conns"
                yield _load(
                    "ingest",
                    label,
                    workers,
                    server,
                    bodies,
                    batch=size,
                    connections=connections,
                    seconds=seconds,
                    max_requests=_MAX_INGEST_EVENTS // size,
                )
    with _bare_serve(setup.state, workers) as server:
        connections = _QUERY_CONNECTIONS * workers
        yield _load(
            "ceiling",
            f"bare FastAPI GET (no auth, no Redis), {named}",
            workers,
            server,
            [get_request("/bare/x", "-")],
            batch=1,
            connections=connections,
            seconds=min(seconds, 5.0),
            max_requests=_MAX_QUERY_REQUESTS,
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
        default="info",
        help="the server's uvicorn log level (default info, as `refold serve`)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="run refold serve with uvicorn's access log (a line per request; default off)",
    )
    parser.add_argument("--skip-query", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args(argv)
    rows: list[Measured] = []
    load = os.getloadavg()[0]  # other work on the machine shows in every figure
    with (
        tempfile.TemporaryDirectory(prefix="refold-bench-serving-") as tmp,
        LocalStack(Path(tmp) / "stack", free_port(), free_port(), redis_persistent=False) as stack,
    ):
        setup = _setup(stack, Path(tmp), args)
        for workers in [int(w) for w in args.workers.split(",") if w.strip()]:
            for row in _workers(setup, workers, not args.skip_query, not args.skip_ingest):
                rows.append(row)
                _progress(row)
    order = {"query": 0, "ingest": 1, "ceiling": 2}
    rows.sort(key=lambda r: (order[r.kind], r.batch, r.processes, r.connections))
    logging = f"{args.log_level}, access log {'on' if args.access_log else 'off'}"
    table = _table(rows, len(setup.keys), logging, load)
    print("\n" + table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "orders": len(setup.keys),
                "cores": os.cpu_count(),
                "seconds": args.seconds,
                "log_level": args.log_level,
                "access_log": args.access_log,
                "load_average_before": load,
                "runs": [r.as_json() for r in rows],
            },
            indent=2,
        )
    )
    print(f"\nresults written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
