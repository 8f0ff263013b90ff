"""A running processor never folds a generation built by other code (issue 18, defect 1).

A user's own package, as a new user hit it: `refold process order_sums` runs fold v1; the file is
edited to v2 (it adds a sum); `replay --to-earliest --execute` builds g2 with v2 and cuts over.
The v1 process used to follow the alias and fold every new event into g2 with v1 (its
fingerprint was read from the edited file), leaving g2 silently wrong. Now it stops with a clear
message, g2 waits (visibly) for code v2, and a v2 process continues it == the v2 oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import process_argv
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.demo import wait_until_caught_up
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.runtime.code_identity import CODE_REFUSED_FIELD
from refold.services.reader.state_reader import StateReader

PROCESSOR = "order_sums"
PACKAGE = "cutover_shop"

CONFIG = """
from refold.contracts.processors import ProcessorSpec

ORDER_SUMS = ProcessorSpec(
    name="order_sums",
    projection="cutover_shop.projection:build",
    topics=("commerce.orders",),
    key="order_id",
    tables=("orders",),
    aggregates=("order_sums_totals",),
    description="events per order (v2: and the amount paid)",
)
"""

# v1 counts each order's events; v2 also sums what was paid. Both fold every commerce type.
FOLD_V1 = """
class OrderSums:
    name = "order_sums"
    table = "orders"
    aggregate = "order_sums_totals"
    event_types = ("OrderPlaced", "OrderLineAdded", "OrderLineRemoved", "OrderPaid",
                   "OrderShipped", "OrderCancelled")

    def key(self, event_type, event):
        return str(event["order_id"])

    def apply(self, state, event_type, event):
        state = state or {"order_id": event["order_id"], "events": 0, "paid": 0}
        return {**state, "events": state["events"] + 1}

    def contribution(self, state):
        return {"orders": 1, "events": state["events"], "paid": state["paid"]}


def build(options):
    return OrderSums()
"""
FOLD_V2 = FOLD_V1.replace(
    '"events": state["events"] + 1}',
    '"events": state["events"] + 1,\n'
    '                "paid": state["paid"] + event.get("amount_minor", 0) * '
    '(event_type == "OrderPaid")}',
)


def _write_package(site: Path) -> Path:
    """The user's package, importable from ``site``, its entry point visible to refold."""
    package = site / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(CONFIG)
    (package / "projection.py").write_text(FOLD_V1)
    dist = site / f"{PACKAGE}-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[refold.processors]\n{PROCESSOR} = {PACKAGE}.config:ORDER_SUMS\n"
    )
    return package / "projection.py"


def _fold(source: str, events: list) -> tuple[dict, dict]:
    scope: dict = {}
    exec(compile(source, "projection.py", "exec"), scope)  # noqa: S102 - the test's own fold
    result = fold_all(scope["build"](None), events)
    return result.states, dict(result.aggregate)


@pytest.mark.timeout(900)
def test_a_running_processor_stops_at_a_cutover_to_other_code_and_new_code_continues(
    world, tmp_path
):
    site = tmp_path / "site"
    projection = _write_package(site)
    env = {
        **world.env,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "REFOLD_ORDER_SUMS__TOPICS": json.dumps([world.topic.name]),
        "REFOLD_ORDER_SUMS__DEAD_LETTER_TOPIC": world.dlq,
        "REFOLD_ORDER_SUMS__MAX_OFFSETS_PER_TRIGGER": "5000",
    }
    reader = StateReader(world.client, PROCESSOR, world.redis.key_prefix)
    registry = GenerationRegistry.of(world.client, PROCESSOR, world.redis.key_prefix)
    publisher = world.publisher()
    events = list(OrderSimulator(600, seed=41))
    publisher.emit_many(events)
    offsets = world.offsets()
    logs = world.state_dir / "logs"
    v1 = GroupProcess(process_argv([PROCESSOR]), env, logs / "v1.log").start()
    v2: GroupProcess | None = None
    try:
        wait_until_caught_up(reader, offsets, [world.topic.name], alive=v1.alive)
        assert reader.live_generation() == 1

        projection.write_text(FOLD_V2)  # the user changes the fold, v1 keeps running
        rebuild = ["--processor", PROCESSOR, "--to-earliest", "--execute"]
        replay = subprocess.run(
            [sys.executable, "-m", "refold.replay", *rebuild],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
        assert reader.live_generation() == 2

        # The v1 process refuses to fold g2 with v1 and stops, saying so in one line.
        assert v1.wait(120) == 1, v1.log_tail()
        log = v1.log_path.read_text()
        assert "g1 was retired and readers now see g2, which was built by other code" in log
        assert "Traceback" not in log.split("was retired and readers now see g2")[-1]
        refused = json.loads(registry.meta(2)[CODE_REFUSED_FIELD])
        assert refused["from_generation"] == 1
        assert refused["code_fingerprint"] == registry.meta(1)["code_fingerprint"]
        assert refused["code_fingerprint"] != registry.meta(2)["code_fingerprint"]

        # Nobody folds g2 now: new events wait (visible lag), its positions do not move.
        before = reader.freshness(2)
        later = list(OrderSimulator(300, seed=42, order_prefix="late-"))
        publisher.emit_many(later)
        status = subprocess.run(
            [sys.executable, "-m", "refold.replay", "status", "--processor", PROCESSOR, "--json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        rows = {row["generation"]: row for row in json.loads(status.stdout)}
        assert rows[2]["status"] == "live"
        assert rows[2]["lag"] >= 300
        assert rows[2]["runner"].startswith("waiting for code"), rows[2]
        assert reader.freshness(2) == before

        # A process with the new code continues g2; the refusal is cleared.
        v2 = GroupProcess(process_argv([PROCESSOR]), env, logs / "v2.log").start()
        wait_until_caught_up(reader, offsets, [world.topic.name], alive=v2.alive)
        assert CODE_REFUSED_FIELD not in registry.meta(2)
    finally:
        offsets.close()
        v1.stop()
        if v2 is not None:
            v2.stop()

    expected_states, expected_totals = _fold(FOLD_V2, events + later)
    states = dict(reader.scan("orders", 2))
    assert states == expected_states
    assert reader.aggregate("order_sums_totals", 2).value == expected_totals
    # g1 stayed v1's, up to where it was retired.
    v1_states, _ = _fold(FOLD_V1, events)
    assert dict(reader.scan("orders", 1)) == v1_states
