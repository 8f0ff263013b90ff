"""The demo's HTTP part: ``refold serve`` on the private stack, its dashboard, read-your-writes.

The service runs as its own process (the command a user runs), with API keys on: the demo makes
a query key for the dashboard's URL and an ingest key, then writes one event over HTTP and reads
it back with the consistency token the ingest answer gave.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from refold.contracts.process_group import GroupProcess
from refold.deploy.local_stack import free_port
from refold.services.auth import ApiKeyStore
from refold.services.client import RefoldClient

__all__ = ["DemoService", "read_your_write", "start_service"]

_START_TIMEOUT_S = 60.0


@dataclass
class DemoService:
    """The running service, its URL and the demo's keys."""

    process: GroupProcess
    url: str
    query_key: str
    ingest_key: str

    @property
    def dashboard(self) -> str:
        """The dashboard's URL, with the query key in its fragment (never sent to the server)."""
        return f"{self.url}/dashboard#key={self.query_key}"

    def stop(self) -> None:
        """Stop the service."""
        self.process.stop()


def start_service(
    client: redis.Redis, key_prefix: str, env: dict[str, str], log: Path
) -> DemoService:
    """Start ``refold serve`` on a free port; return once it answers.

    Raises:
        RuntimeError: It exited or did not answer within a minute (its log says why).
    """
    store = ApiKeyStore(client, key_prefix)
    query_key = store.add(f"demo-dashboard-{uuid.uuid4().hex[:6]}", ["query"])
    ingest_key = store.add(f"demo-ingest-{uuid.uuid4().hex[:6]}", ["ingest", "query"])
    port = free_port()
    process = GroupProcess(
        [
            sys.executable,
            "-m",
            "refold.deploy.serve_cli",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        {**env, "REFOLD_SERVE__AUTH": "keys"},
        log,
    ).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{url}/health/live", timeout=1).status_code == 200:
                return DemoService(process, url, query_key, ingest_key)
        except httpx.TransportError:
            pass
        if not process.alive() or time.monotonic() > deadline:
            process.stop()
            msg = f"refold serve did not start; see {log}:\n{process.log_tail()}"
            raise RuntimeError(msg)
        time.sleep(0.2)


def read_your_write(service: DemoService, event_type: str, event: dict[str, object]) -> None:
    """Ingest one event over HTTP and read its order back with the token; print both."""
    with RefoldClient(service.url, service.ingest_key, timeout=30) as refold:
        started = time.monotonic()
        written = refold.ingest([(event_type, event)])
        delivery = written.deliveries[0]
        order = str(event["order_id"])
        seen = refold.entity(
            "order_state",
            "orders",
            order,
            consistency_token=written.consistency_token,
            wait_ms=20_000,
        )
        waited = time.monotonic() - started
    print(
        f"POST /v1/events: {event_type} {order} -> {delivery.topic}/{delivery.partition}"
        f"@{delivery.offset}, consistency token {written.consistency_token[:24]}..."
    )
    print(
        f"GET .../order_state/tables/orders/entities/{order}?consistency_token=...: status "
        f"{seen.value.get('status')!r}, generation {seen.generation}, read {waited:.2f}s after "
        "the write was sent (the query waited until the live generation had applied it)"
    )
