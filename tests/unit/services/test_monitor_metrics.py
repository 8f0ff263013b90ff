"""/metrics' families from fixed figures (no servers), and the lag values they come from."""

from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from refold.contracts.store.stats import batch_increments, parse_stats
from refold.services.monitor.metrics import GenerationMetrics, MetricsSnapshot, metric_families
from refold.services.monitor.tracking import replay_progress
from refold.services.monitor.views import GenerationLag, GenerationView, PartitionLag


def _stats(*batches):
    stored: dict[str, int] = {}
    for batch in batches:
        for name, amount in batch_increments(*batch):
            stored[name] = stored.get(name, 0) + amount
    return parse_stats({**{k: str(v) for k, v in stored.items()}, "watermark_ms": "90000"})


def _lag(generation, *rows, complete=True):
    return GenerationLag("orders_proc", generation, tuple(PartitionLag(*r) for r in rows), complete)


class _Fixed:
    def __init__(self, snapshot):
        self.snapshot = snapshot

    def collect(self):
        return metric_families(self.snapshot)


def _scrape(snapshot) -> dict[str, dict[tuple, float]]:
    registry = CollectorRegistry()
    registry.register(_Fixed(snapshot))
    text = generate_latest(registry).decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def _snapshot(**overrides):
    live = GenerationMetrics(
        "orders_proc",
        1,
        "live",
        _stats((10, 1, 2, {"rejected": 1}, 80), (5, 0, 0, {"bad-body": 2}, 3000)),
        _lag(1, ("t", 0, 7, 10, 3, 4.5), ("t", 1, 5, 5, 0, 0.0)),
        stalled=True,
    )
    building = GenerationMetrics(
        "orders_proc",
        2,
        "building",
        _stats(),
        _lag(2, ("t", 0, 1, None, None, None), complete=False),
        progress=replay_progress({}, {("t", 0): 1}, {("t", 0): 4}, None),
    )
    values = {
        "live": {"orders_proc": 1, "idle_proc": None},
        "statuses": {("orders_proc", 1): "live", ("orders_proc", 2): "building"},
        "generations": [live, building],
        "webhooks": {"alerts": {"delivered": 7, "failed": 2, "failed:http-500": 2, "retried": 3}},
        "broker_up": False,
        "now_ms": 100_000.0,
    }
    return MetricsSnapshot(**{**values, **overrides})


def test_the_counters_and_histogram_come_from_the_stats():
    samples = _scrape(_snapshot())
    g1 = (("generation", "1"), ("processor", "orders_proc"))
    assert samples["refold_events_applied_total"][g1] == 15
    assert samples["refold_batches_total"][g1] == 2
    assert samples["refold_duplicates_skipped_total"][g1] == 1
    assert samples["refold_effects_total"][g1] == 2
    dead = samples["refold_dead_letters_total"]
    assert dead[(("generation", "1"), ("processor", "orders_proc"), ("reason", "rejected"))] == 1
    assert dead[(("generation", "1"), ("processor", "orders_proc"), ("reason", "bad-body"))] == 2
    buckets = samples["refold_batch_duration_seconds_bucket"]
    assert buckets[(*g1[:1], ("le", "0.1"), g1[1])] == 1
    assert buckets[(*g1[:1], ("le", "5.0"), g1[1])] == 2
    assert buckets[(*g1[:1], ("le", "+Inf"), g1[1])] == 2
    assert samples["refold_batch_duration_seconds_count"][g1] == 2
    assert samples["refold_batch_duration_seconds_sum"][g1] == 3.08
    assert samples["refold_watermark_delay_seconds"][g1] == 10.0


def test_lag_progress_stalls_and_generations():
    samples = _scrape(_snapshot())
    g1 = (("generation", "1"), ("processor", "orders_proc"))
    g2 = (("generation", "2"), ("processor", "orders_proc"))
    p0, p1 = (
        (("generation", "1"), ("partition", str(p)), ("processor", "orders_proc"), ("topic", "t"))
        for p in (0, 1)
    )
    assert samples["refold_lag_records"] == {p0: 3, p1: 0}  # g2's unknown lag is left out
    assert samples["refold_lag_seconds"] == {p0: 4.5, p1: 0.0}
    assert samples["refold_replay_progress_ratio"] == {g2: 0.25}
    assert samples["refold_generation_stalled"] == {g1: 1, g2: 0}
    assert samples["refold_generation_live"] == {(("processor", "orders_proc"),): 1}
    statuses = samples["refold_generation_status"]
    assert statuses[(*g1[:1], g1[1], ("status", "live"))] == 1
    assert samples["refold_lag_probe_up"] == {(): 0}


def test_webhook_deliveries_by_outcome_and_failures_by_reason():
    samples = _scrape(_snapshot())
    deliveries = samples["refold_webhook_deliveries_total"]
    assert deliveries == {
        (("dispatcher", "alerts"), ("outcome", "delivered")): 7,
        (("dispatcher", "alerts"), ("outcome", "failed")): 2,
        (("dispatcher", "alerts"), ("outcome", "retried")): 3,
    }
    assert samples["refold_webhook_failures_total"] == {
        (("dispatcher", "alerts"), ("reason", "http-500")): 2
    }


def test_an_empty_platform_still_renders():
    samples = _scrape(_snapshot(live={}, statuses={}, generations=[], webhooks={}, broker_up=True))
    assert samples["refold_lag_probe_up"] == {(): 1}
    assert "refold_events_applied_total" not in samples


def test_a_generation_view_reads_its_meta():
    view = GenerationView(
        "p",
        3,
        "building",
        {
            "created_at": "1700000000000",
            "starting_offsets": '{"orders": {"0": 100}}',
            "topics": '["orders"]',
            "code_fingerprint": "abc",
        },
        {("orders", 0): 130, ("orders", 1): 5},
        running=True,
    )
    assert view.created_at == 1_700_000_000_000
    assert view.applied == 30 + 5
    assert view.topics(("fallback",)) == ("orders",)
    assert view.code_fingerprint == "abc"
    bare = GenerationView("p", 1, "live", {"starting_offsets": "earliest"}, {}, running=False)
    assert (bare.created_at, bare.applied, bare.topics(("t",))) == (None, 0, ("t",))
