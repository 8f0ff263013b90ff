"""The HTTP services in front of the real Spark processor: write over HTTP, read your write.

``refold serve`` runs as its own process (API keys on), order_state as its own Spark process;
an event ingested over HTTP is read back with the answer's consistency token, once the
processor has applied it; /metrics reports what the processor's driver recorded, and /health,
the lag and the generations agree with Redis.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from refold.deploy.demo_serving import start_service
from refold.deploy.simulators.orders import OrderSimulator
from refold.services.auth import ApiKeyStore
from refold.services.client import NotFoundError, RefoldClient
from tests.support.waiting import answer_within_budget, assert_eventually

from .conftest import oracle


def test_an_event_written_over_http_is_read_back_with_its_token(world) -> None:
    events = list(OrderSimulator(200, seed=31))
    before, written_later = events[:-40], events[-40:]
    world.publisher().emit_many(before)
    processor = world.processor().start()
    env = {**world.env, "REFOLD_SERVE__TOPICS": json.dumps({"commerce.orders": world.topic.name})}
    service = start_service(
        world.client, world.redis.key_prefix, env, world.state_dir / "logs" / "serve.log"
    )
    try:
        with RefoldClient(service.url, service.ingest_key, timeout=60) as refold:

            def started() -> bool:
                try:  # the first entity, following the cursors: a page may be empty
                    return next(iter(refold.scan("order_state", "orders")), None) is not None
                except NotFoundError:  # no live generation before the first batch
                    return False

            assert_eventually(
                started,
                timeout=180,
                alive=processor.alive,
                message=processor.log_tail,
            )
            written = refold.ingest(written_later)
            assert {d.topic for d in written.deliveries} == {world.topic.name}
            last = written_later[-1][1]["order_id"]
            seen = refold.entity(
                "order_state",
                "orders",
                last,
                consistency_token=written.consistency_token,
                wait_ms=60_000,
            )
            wanted = oracle(events)
            assert seen.value == wanted.states[last]
            for (topic, partition), offset in _needed(written).items():
                assert seen.positions[f"{topic}/{partition}"] >= offset
            assert dict(refold.scan("order_state", "orders")) == wanted.states

        headers = {"Authorization": f"Bearer {service.query_key}"}
        with httpx.Client(base_url=service.url, headers=headers, timeout=30) as http:
            lag = answer_within_budget(lambda: http.get("/v1/processors/order_state/lag"))
            assert lag["lag_records"] == 0
            assert http.get("/health").status_code == 200
            metrics = {
                (sample.name, sample.labels.get("processor")): sample.value
                for family in text_string_to_metric_families(http.get("/metrics").text)
                for sample in family.samples
            }
            applied = metrics[("refold_events_applied_total", "order_state")]
            assert applied == len(events)
            listed = http.get("/v1/processors").json()["processors"]
            order_state = next(p for p in listed if p["name"] == "order_state")
            assert order_state["live_generation"] == 1

            # control: a dry run with a query key; execute needs an admin key
            plan = http.post("/v1/processors/order_state/replays:plan", json={"to": "earliest"})
            assert plan.status_code == 200, plan.text
            assert plan.json()["ready"] is True
            assert plan.json()["total_events"] == len(events)
            refused = http.post("/v1/processors/order_state/replays", json={"to": "earliest"})
            assert refused.status_code == 403
            ops = ApiKeyStore(world.client, world.redis.key_prefix).add("ops", ["admin"])
            admin = {"Authorization": f"Bearer {ops}"}
            started = http.post(
                "/v1/processors/order_state/replays", json={"to": "earliest"}, headers=admin
            )
            assert started.status_code == 202, started.text
            log = Path(started.json()["log"])

            def flipped() -> bool:
                progress = http.get("/v1/replays").json()["replays"]
                for replay in progress:
                    assert replay["processor"] == "order_state"
                    assert replay["generation"] == 2
                    assert 0 <= replay["done"] <= replay["total"]
                return any(
                    p["name"] == "order_state" and p["live_generation"] == 2
                    for p in http.get("/v1/processors").json()["processors"]
                )

            assert_eventually(
                flipped, timeout=240, interval=0.5, message=lambda: log.read_text()[-3000:]
            )
            assert dict(world.reader().scan("orders", 2)) == wanted.states
            back = http.post("/v1/processors/order_state/rollback", headers=admin)
            assert back.status_code == 200, back.text
            assert back.json() == {"processor": "order_state", "live_generation": 1, "retired": 2}
            dry = http.post("/v1/processors/order_state/gc", headers=admin).json()
            assert dry["executed"] is False
            assert [g["generation"] for g in dry["generations"]] == [2]
    finally:
        service.stop()
        processor.stop()


def _needed(written) -> dict[tuple[str, int], int]:
    needed: dict[tuple[str, int], int] = {}
    for d in written.deliveries:
        needed[(d.topic, d.partition)] = max(needed.get((d.topic, d.partition), 0), d.offset + 1)
    return needed
