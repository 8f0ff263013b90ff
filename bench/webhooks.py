"""Webhook deliveries per second to a local receiver: the dispatcher against plain HTTP.

``python -m bench webhooks [--insights 5000] [--concurrency 1,8] [--fail-every 10]``. On a
private local stack (Apache Kafka + redis-server), with the receiver (``deploy/simulators/
webhook_receiver.py``) in a process of its own, over one topic of pre-produced ``Insight``
records (4 partitions):

1. **baseline**: the same JSON bodies and headers POSTed by a plain ``httpx.Client`` loop
   (one keep-alive connection), then by a thread pool sharing one client at each concurrency:
   the HTTP ceiling of this machine, without Kafka, decoding or Redis;
2. **dispatcher**: ``WebhookDispatcher`` (``until_end``) at each concurrency: consume, decode,
   POST, then per batch the positions, log entries and counters in Redis;
3. **dispatcher, failing receiver**: every ``--fail-every``-th request answers 503 (retried
   after a backoff), at the highest concurrency.

Rates are deliveries/s between the receiver's first and last accepted request (steady), and
over the whole run including start-up. Prints a table, writes ``bench/results/webhooks.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.simulators.insights import insights, produce_insights
from refold.processors.runtime.kafka_ranges import read_log
from refold.services.webhooks import WebhookDispatcher, WebhookSettings
from refold.services.webhooks.delivery import RetryPolicy
from refold.services.webhooks.items import item_from_message

__all__ = ["RESULTS", "main"]

RESULTS = Path(__file__).parent / "results" / "webhooks.json"
TOPIC = TopicSpec("bench.insights", 4, "key", ("Insight",))
PREFIX = "bench-webhooks"


@dataclass(frozen=True, slots=True)
class Measured:
    """One run: deliveries, the steady and whole-run rates, what the receiver saw."""

    label: str
    concurrency: int
    deliveries: int
    requests: int
    duplicates: int
    steady_per_s: float
    wall_per_s: float
    wall_s: float


@contextlib.contextmanager
def _receiver(fail_every: int = 0) -> Iterator[str]:
    """A receiver process on a free port; yields its URL."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "refold.deploy.simulators.webhook_receiver",
        "--port",
        str(port),
        "--fail-every",
        str(fail_every),
        "--quiet",
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/_stats", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    msg = "the webhook receiver did not start"
                    raise RuntimeError(msg) from None
                time.sleep(0.05)
        yield f"{url}/hooks"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _stats(url: str) -> dict[str, object]:
    base = url.rsplit("/", 1)[0]
    stats: dict[str, object] = httpx.get(f"{base}/_stats", timeout=10).json()
    return stats


def _measure(label: str, concurrency: int, url: str, started: float, ended: float) -> Measured:
    stats = _stats(url)
    accepted = int(str(stats["accepted"]))
    first, last = stats["first_at"], stats["last_at"]
    span = float(str(last)) - float(str(first)) if first and last else 0.0
    wall = ended - started
    return Measured(
        label,
        concurrency,
        accepted,
        int(str(stats["requests"])),
        int(str(stats["duplicates"])),
        (accepted - 1) / span if span > 0 else 0.0,
        accepted / wall if wall > 0 else 0.0,
        wall,
    )


def _requests(bootstrap: str) -> list[tuple[bytes, dict[str, str]]]:
    """The bodies and headers the dispatcher sends, built the same way, for the baseline."""
    codec, policy = EventCodec(), RetryPolicy(1, 1.0, 1.0)
    out = []
    for chunk in read_log({"bootstrap.servers": bootstrap}, TOPIC.name):
        for message in chunk:
            item = item_from_message(message, codec, policy.new_state())
            headers = {"Content-Type": "application/json", **item.request_headers("baseline")}
            out.append((item.body, headers))
    return out


def _baseline(requests: Sequence[tuple[bytes, dict[str, str]]], concurrency: int) -> Measured:
    with (
        _receiver() as url,
        httpx.Client(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        ) as client,
    ):
        started = time.time()
        if concurrency == 1:
            for body, headers in requests:
                client.post(url, content=body, headers=headers).raise_for_status()
        else:
            with ThreadPoolExecutor(concurrency) as pool:
                for response in pool.map(
                    lambda r: client.post(url, content=r[0], headers=r[1]), requests
                ):
                    response.raise_for_status()
        ended = time.time()
        label = "httpx POST loop" if concurrency == 1 else f"httpx POST, {concurrency} threads"
        return _measure(label, concurrency, url, started, ended)


def _dispatcher(stack: LocalStack, concurrency: int, run: int, fail_every: int = 0) -> Measured:
    with _receiver(fail_every) as url:
        settings = WebhookSettings(
            name=f"bench-{run}",
            url=url,
            topics=(TOPIC.name,),
            concurrency=concurrency,
            backoff_initial_s=0.05,
            backoff_max_s=1.0,
        )
        client = redis_client(stack.redis_url)
        dispatcher = WebhookDispatcher(
            settings,
            {"bootstrap.servers": stack.bootstrap_servers},
            client,
            PREFIX,
            until_end=True,
        )
        started = time.time()
        dispatcher.run()
        ended = time.time()
        client.close()
        label = f"dispatcher, concurrency {concurrency}"
        if fail_every:
            label += f", every {fail_every}th request 503"
        return _measure(label, concurrency, url, started, ended)


def _table(rows: Sequence[Measured], total: int) -> str:
    base = {r.concurrency: r.steady_per_s for r in rows if r.label.startswith("httpx")}
    lines = [
        f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {total:,} insights",
        f"{'run':<52} {'steady/s':>9} {'wall/s':>8} {'requests':>9} {'dup':>4} {'vs HTTP':>8}",
    ]
    for r in rows:
        ratio = r.steady_per_s / base[r.concurrency] if base.get(r.concurrency) else 0.0
        versus = f"{ratio:.0%}" if not r.label.startswith("httpx") and ratio else ""
        lines.append(
            f"{r.label:<52} {r.steady_per_s:>9,.0f} {r.wall_per_s:>8,.0f} {r.requests:>9,} "
            f"{r.duplicates:>4} {versus:>8}"
        )
    return "\n".join(lines)


def _progress(row: Measured) -> None:
    print(f"  {row.label}: {row.steady_per_s:,.0f} deliveries/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench webhooks``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench webhooks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--insights", type=int, default=5_000, help="insight records")
    parser.add_argument(
        "--concurrency", default="1,8", help="comma-separated concurrencies (default 1,8)"
    )
    parser.add_argument(
        "--fail-every", type=int, default=10, help="failing-receiver run: 503 every n-th (0: skip)"
    )
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rows: list[Measured] = []
    with (
        tempfile.TemporaryDirectory(prefix="refold-bench-webhooks-") as tmp,
        LocalStack(Path(tmp) / "stack", free_port(), free_port(), redis_persistent=False) as stack,
    ):
        ensure_topics({"bootstrap.servers": stack.bootstrap_servers}, [TOPIC])
        produce_insights(stack.bootstrap_servers, TOPIC.name, list(insights(args.insights)))
        requests = _requests(stack.bootstrap_servers)
        print(f"{len(requests):,} insights on {TOPIC.name}", flush=True)
        for concurrency in levels:
            rows.append(_baseline(requests, concurrency))
            _progress(rows[-1])
        for run, concurrency in enumerate(levels):
            rows.append(_dispatcher(stack, concurrency, run))
            _progress(rows[-1])
        if args.fail_every:
            rows.append(_dispatcher(stack, max(levels), len(levels), args.fail_every))
            _progress(rows[-1])
    table = _table(rows, len(requests))
    print("\n" + table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"insights": len(requests), "cores": os.cpu_count(), "runs": [asdict(r) for r in rows]},
            indent=2,
        )
    )
    print(f"\nresults written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
