"""replay status / diff / rollback / gc on generations written by the real fold writer."""

import json
from pathlib import Path

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.settings import SparkSettings
from refold.contracts.store.connect import is_cluster, redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.checkpoints import checkpoint_location, checkpoint_root
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.replay.__main__ import main as replay
from refold.services.reader.state_reader import StateReader


@pytest.fixture
def two_generations(kafka_bootstrap, redis_url, make_topic, unique, monkeypatch, tmp_path):
    topic = make_topic(partitions=2, prefix="orders")
    prefix = f"test-{unique}"
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", prefix)
    monkeypatch.setenv("REFOLD_STATE_DIR", str(tmp_path))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    codec = EventCodec()
    events = list(OrderSimulator(50, seed=3, anomaly_rate=0))
    records = [
        SourceRecord(topic, 0, i, e["order_id"].encode(), codec.encode(t, e))
        for i, (t, e) in enumerate(events)
    ]
    gens = []
    for live in (True, False):
        gen = registry.create({"topics": [topic]}, live=live)
        target = FoldTarget(
            "order_state",
            gen,
            redis_url,
            prefix,
            (("bootstrap.servers", kafka_bootstrap),),
            f"dlq-{unique}",
        )
        FoldWriter(target, OrderStateProjection()).apply(records)
        gens.append(gen)
    return client, registry, prefix, gens, tmp_path


def test_status_lists_generations_with_lag(two_generations, capsys):
    _client, _registry, _prefix, (g1, g2), _tmp = two_generations
    assert replay(["status", "--processor", "order_state", "--json"]) == 0
    rows = {r["generation"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[g1]["status"] == "live"
    assert rows[g2]["status"] == "building"
    assert rows[g1]["applied"] == rows[g2]["applied"] > 0
    assert replay(["status"]) == 0
    assert "order_state" in capsys.readouterr().out


def test_status_shows_processors_in_redis_that_no_package_registers(two_generations, capsys):
    client, _registry, prefix, _gens, _tmp = two_generations
    ghost = GenerationRegistry.of(client, "ghost_stats", prefix)
    ghost.create({"topics": []}, live=True)  # e.g. a plug-in uninstalled since
    assert replay(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["processor"], r["registered"]) for r in rows} == {
        ("order_state", True),
        ("ghost_stats", False),
    }
    assert replay(["status"]) == 0
    out = capsys.readouterr().out
    assert "ghost_stats?" in out
    assert "no installed package registers it" in out


def test_diff_finds_a_changed_key(two_generations, capsys):
    client, registry, _prefix, (g1, g2), _tmp = two_generations
    assert replay(["diff", "--processor", "order_state", str(g1), str(g2)]) == 0
    assert "NOT" not in capsys.readouterr().out
    key = registry.keys(g2).table("orders", "ord-0000002")
    state = json.loads(client.get(key))
    client.set(key, json.dumps({**state, "status": "lost"}))
    client.delete(registry.keys(g2).table("orders", "ord-0000003"))
    assert replay(["diff", "--processor", "order_state", str(g1), str(g2)]) == 4
    out = capsys.readouterr().out
    assert "orders:ord-0000002" in out
    assert f"only in g{g1}: orders:ord-0000003" in out
    assert "NOT identical" in out


def test_rollback_flips_back_and_gc_removes_the_retired_generation(two_generations, capsys):
    client, registry, prefix, (g1, g2), tmp = two_generations
    reader = StateReader(client, "order_state", prefix)
    registry.flip(g2)
    assert reader.live_generation() == g2
    assert replay(["rollback", "--processor", "order_state"]) == 0
    assert reader.live_generation() == g1
    assert registry.status(g2) == "retired"
    assert replay(["rollback", "--processor", "order_state"]) == 1  # g1 replaced nothing
    assert "nothing to roll back" in capsys.readouterr().err
    root = checkpoint_root(tmp, SparkSettings(), key_prefix=prefix)
    checkpoint = Path(checkpoint_location(root, "order_state", g2))
    checkpoint.mkdir(parents=True)
    stats = ProcessorStats(client, registry.layout)
    stats.record_batch(g2, 0, 50, 0, 0, {}, 10.0, None, now_ms=1)
    assert client.exists(registry.keys(g2).stats)
    assert replay(["gc", "--processor", "order_state"]) == 0
    assert "would be removed" in capsys.readouterr().out
    assert registry.status(g2) == "retired"
    assert replay(["gc", "--processor", "order_state", "--execute"]) == 0
    assert registry.status(g2) is None
    assert not list(client.scan_iter(match=registry.keys(g2).pattern()))  # the stats too
    assert not checkpoint.exists()
    assert reader.get("orders", "ord-0000001").value is not None


def test_plan_json_for_scripts(two_generations, capsys):
    _client, _registry, _prefix, (g1, _g2), _tmp = two_generations
    assert replay(["--processor", "order_state", "--to-earliest", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["live_generation"] == g1
    assert plan["total_events"] == 0  # the records were folded, never produced to the topic
    assert {p["partition"] for p in plan["partitions"]} == {0, 1}


def test_a_registry_written_before_its_hash_tag_is_adopted_with_its_live_generation(
    redis_url, unique
):
    client = redis_client(redis_url)
    prefix = f"test-{unique}"
    legacy = (f"{prefix}:order_state:live", f"{prefix}:order_state:generations")
    # As an older refold wrote it: no hash tag on the alias and the generations hash.
    client.hset(legacy[1], mapping={"1": "retired", "2": "live"})
    client.set(legacy[0], "2")
    client.hset(f"{prefix}:{{order_state.g2}}:meta", mapping={"replaced": "1", "live_since": "7"})

    registry = GenerationRegistry.of(client, "order_state", prefix)
    if is_cluster(client):
        # An older refold could not flip on a cluster (its alias and registry were in two
        # slots), so no deployment holds such keys there: they are left as they are.
        assert registry.live() is None
        assert [client.exists(key) for key in legacy] == [1, 1]
        return
    assert registry.live() == 2
    assert [(g.generation, g.status) for g in registry.list()] == [(1, "retired"), (2, "live")]
    assert registry.meta(2)["replaced"] == "1"  # what a rollback flips back to
    assert not client.exists(*legacy)
    assert GenerationRegistry.of(client, "order_state", prefix).live() == 2  # adopted once
    assert registry.flip(1, record_replaced=False) == 2
    assert client.get(f"{prefix}:{{order_state}}:live") == b"1"
