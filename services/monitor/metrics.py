"""``/metrics``: refold's figures in the Prometheus format, read at scrape time.

A custom collector (:class:`RefoldCollector`) reads Redis and the broker on each scrape and
registers on a registry of the app's own, never on prometheus_client's global one, so tests
and several apps in one process do not collide. Counters come from the processors' stats
hashes (:mod:`refold.contracts.store.stats`) and the webhook dispatchers' counters, so they survive
restarts of the services and agree between replicas.

A scrape waits for the broker at most the monitor's budget: when it does not answer, the lag
series are missing from that scrape (and ``refold_lag_probe_up`` is 0), the rest is there.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from refold.contracts.service_keys import WebhookKeys
from refold.contracts.store.stats import BatchStats
from refold.services.monitor.status import Monitor
from refold.services.monitor.tracking import Progress
from refold.services.monitor.views import GenerationLag
from refold.services.webhooks.store import WebhookStore, list_dispatchers

__all__ = ["GenerationMetrics", "MetricsSnapshot", "RefoldCollector", "metric_families"]

logger = logging.getLogger(__name__)

_GEN = ["processor", "generation"]
# Dispatchers are listed (one SCAN) at most this often.
_DISPATCHERS_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class GenerationMetrics:
    """The figures of one generation that should be moving (live, or being built)."""

    processor: str
    generation: int
    status: str
    stats: BatchStats
    lag: GenerationLag
    progress: Progress | None = None
    stalled: bool = False


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Everything one scrape reports (built by :class:`RefoldCollector`, rendered purely)."""

    live: dict[str, int | None]
    statuses: dict[tuple[str, int], str]
    generations: list[GenerationMetrics]
    webhooks: dict[str, dict[str, int]] = field(default_factory=dict)
    broker_up: bool = True
    now_ms: float = 0.0


def _labels(g: GenerationMetrics) -> list[str]:
    return [g.processor, str(g.generation)]


def _bound(ms: float) -> str:
    return "+Inf" if math.isinf(ms) else repr(ms / 1000)


def metric_families(snapshot: MetricsSnapshot) -> list[Metric]:
    """The metric families of a snapshot (pure)."""
    live = GaugeMetricFamily(
        "refold_generation_live", "The live generation of each processor", labels=["processor"]
    )
    for processor, generation in sorted(snapshot.live.items()):
        if generation is not None:
            live.add_metric([processor], generation)
    status = GaugeMetricFamily(
        "refold_generation_status",
        "1 for each generation's status (building, live, retired)",
        labels=[*_GEN, "status"],
    )
    for (processor, generation), name in sorted(snapshot.statuses.items()):
        status.add_metric([processor, str(generation), name], 1)
    families: list[Metric] = [live, status]
    families += _stats_families(snapshot.generations)
    families += _lag_families(snapshot)
    families += _webhook_families(snapshot.webhooks)
    up = GaugeMetricFamily(
        "refold_lag_probe_up", "1 when the broker answered the last lag probe in time"
    )
    up.add_metric([], 1 if snapshot.broker_up else 0)
    families.append(up)
    return families


def _stats_families(gens: list[GenerationMetrics]) -> list[Metric]:
    events = CounterMetricFamily(
        "refold_events_applied", "Records applied by a generation", labels=_GEN
    )
    batches = CounterMetricFamily("refold_batches", "Micro-batches of a generation", labels=_GEN)
    duplicates = CounterMetricFamily(
        "refold_duplicates_skipped", "Records skipped as re-sent by their upstream", labels=_GEN
    )
    effects = CounterMetricFamily("refold_effects", "Outputs produced", labels=_GEN)
    dead = CounterMetricFamily(
        "refold_dead_letters", "Dead letters by reason", labels=[*_GEN, "reason"]
    )
    duration = HistogramMetricFamily(
        "refold_batch_duration_seconds", "Wall time of micro-batches on the driver", labels=_GEN
    )
    last = GaugeMetricFamily(
        "refold_last_batch_timestamp_seconds", "When the last micro-batch ended", labels=_GEN
    )
    for g in gens:
        labels, stats = _labels(g), g.stats
        events.add_metric(labels, stats.events)
        batches.add_metric(labels, stats.batches)
        duplicates.add_metric(labels, stats.duplicates)
        effects.add_metric(labels, stats.effects)
        for reason, count in stats.dead_letters.items():
            dead.add_metric([*labels, reason], count)
        duration.add_metric(
            labels,
            [(_bound(b), n) for b, n in stats.duration_buckets],
            sum_value=stats.duration_sum_ms / 1000,
        )
        if stats.last_batch_at is not None:
            last.add_metric(labels, stats.last_batch_at / 1000)
    return [events, batches, duplicates, effects, dead, duration, last]


def _lag_families(snapshot: MetricsSnapshot) -> list[Metric]:
    partition = [*_GEN, "topic", "partition"]
    records = GaugeMetricFamily(
        "refold_lag_records", "Records after a generation's position", labels=partition
    )
    seconds = GaugeMetricFamily(
        "refold_lag_seconds", "How long the first record not applied has waited", labels=partition
    )
    watermark = GaugeMetricFamily(
        "refold_watermark_delay_seconds",
        "How far the event-time watermark is behind the wall clock",
        labels=_GEN,
    )
    progress = GaugeMetricFamily(
        "refold_replay_progress_ratio",
        "Share of the log from its start a building generation has applied",
        labels=_GEN,
    )
    stalled = GaugeMetricFamily(
        "refold_generation_stalled",
        "1 when records wait on a partition whose position has not moved for stall_after_s",
        labels=_GEN,
    )
    for g in snapshot.generations:
        labels = _labels(g)
        for part in g.lag.partitions:
            at = [*labels, part.topic, str(part.partition)]
            if part.lag_records is not None:
                records.add_metric(at, part.lag_records)
            if part.lag_seconds is not None:
                seconds.add_metric(at, part.lag_seconds)
        if g.stats.watermark_ms is not None:
            delay = max(0.0, snapshot.now_ms - g.stats.watermark_ms) / 1000
            watermark.add_metric(labels, delay)
        if g.progress is not None:
            progress.add_metric(labels, g.progress.ratio)
        stalled.add_metric(labels, 1 if g.stalled else 0)
    return [records, seconds, watermark, progress, stalled]


def _webhook_families(webhooks: dict[str, dict[str, int]]) -> list[Metric]:
    deliveries = CounterMetricFamily(
        "refold_webhook_deliveries",
        "Webhook deliveries by outcome (delivered, failed, retried, redriven)",
        labels=["dispatcher", "outcome"],
    )
    failures = CounterMetricFamily(
        "refold_webhook_failures",
        "Failed webhook deliveries by reason",
        labels=["dispatcher", "reason"],
    )
    for name, counters in sorted(webhooks.items()):
        for key, count in sorted(counters.items()):
            kind, _sep, reason = key.partition(":")
            if reason and kind == "failed":
                failures.add_metric([name, reason], count)
            elif not reason:
                deliveries.add_metric([name, key], count)
    return [deliveries, failures]


class RefoldCollector(Collector):
    """Reads the figures at scrape time (see the module docstring). Thread-safe.

    Args:
        monitor: The app's monitor.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._dispatchers: tuple[float, list[str]] | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        """One scrape's metric families (Redis down: only ``refold_redis_up`` 0)."""
        up = GaugeMetricFamily("refold_redis_up", "1 when Redis answered this scrape")
        try:
            snapshot = self.snapshot()
        except redis.RedisError as exc:
            logger.warning("metrics: Redis did not answer: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metric_families(snapshot)

    def snapshot(self) -> MetricsSnapshot:
        """Read everything one scrape reports."""
        monitor = self.monitor
        deadline = monitor.deadline()
        watched = monitor.watch(deadline)
        live: dict[str, int | None] = {}
        statuses: dict[tuple[str, int], str] = {}
        for info in monitor.processors():
            live[info.name] = monitor.live(info)
            for view in monitor.generations(info):
                statuses[info.name, view.generation] = view.status
        stats = {
            (w.info.name, w.view.generation): monitor.stats(w.info, [w.view.generation])[
                w.view.generation
            ]
            for w in watched
        }
        gens = [
            GenerationMetrics(
                w.info.name,
                w.view.generation,
                w.view.status,
                stats[w.info.name, w.view.generation],
                w.lag,
                monitor.progress(w.view, w.lag) if w.view.status == "building" else None,
                bool(w.stalls),
            )
            for w in watched
        ]
        return MetricsSnapshot(
            live,
            statuses,
            gens,
            self._webhooks(),
            broker_up=all(w.lag.complete for w in watched) and monitor.probe.healthy,
            now_ms=time.time() * 1000,
        )

    def _webhooks(self) -> dict[str, dict[str, int]]:
        monitor = self.monitor
        now = time.monotonic()
        with self._lock:
            if self._dispatchers is None or now - self._dispatchers[0] > _DISPATCHERS_TTL_S:
                self._dispatchers = (now, list_dispatchers(monitor.client, monitor.prefix))
            names = self._dispatchers[1]
        # Read only: the log cap of a store matters to writers alone.
        return {
            name: WebhookStore(monitor.client, WebhookKeys(name, monitor.prefix), 0).counters()
            for name in names
        }
