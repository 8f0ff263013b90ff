"""Produce -> state latency of each engine whose state another process can read (Redis).

Each engine reads a topic of its own, empty when it starts, and runs until stopped (Bytewax
and Flink with ``--tail true``, refold's processor without ``--available-now``). Once its state
shows a probe (an order placed every second until one is written), order events are sent at
``rate`` a second for ``warmup`` seconds, not counted, then for ``seconds`` more. An order's
state is readable from the moment the engine first writes its key to Redis: keyspace
notifications (``notify-keyspace-events K$``: SET and MSET, as every engine here writes) tell a
thread here when, and each counted order's latency runs from the send of its first event
(``OrderPlaced``) to that notification, the load generator's 20 ms batching included (as in
``make bench``, :mod:`bench.latency`).

Left out: the in-memory variants (no other process can read their state) and refold's
baseline (a bounded catch-up that applies 20k records a transaction).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from bench.backlog import ORDERS_TOPIC
from bench.latency import LatencyResult, paced_producer, send_paced
from bench.peers.engines import Engine, Job, spark_processor
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.process_group import GroupProcess
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import TopicSpec
from refold.deploy.simulators.orders import OrderSimulator

__all__ = ["SPARK_PREFIX", "FirstWrites", "measure_engine_latency", "why_no_latency"]

SPARK_PREFIX = "peers-spark-latency"  # refold's processor's keys in the latency run
_ORDERS = "lat-"
_PROBES = "probe-"
_READY_S = 240.0  # start-up, a Spark driver's included, on a loaded 2-core machine
_DRAIN_S = 30.0  # after the last send, for the last orders to show up
_PARTITIONS = 8


def why_no_latency(engine: Engine) -> str:
    """Why ``engine`` has no latency figure ("" when it has one)."""
    if engine.name == "refold-spark":
        return ""
    if engine.module == "bench.peers.baseline_peer":
        return "bounded catch-up only"
    if not engine.redis:
        return "state not readable outside the process"
    return ""


class FirstWrites:
    """When each key matching ``pattern`` was first written (SET, MSET), by its last ``:`` part.

    ``first``: ``time.monotonic()`` as the notification arrived. Turns the server's keyspace
    notifications on; :meth:`close` puts back what was set before.
    """

    def __init__(self, client: redis.Redis, pattern: str) -> None:
        self.first: dict[str, float] = {}
        self._client = client
        config = client.config_get("notify-keyspace-events")
        self._before = str(config.get("notify-keyspace-events") or "")
        client.config_set("notify-keyspace-events", "K$")
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.psubscribe(**{f"__keyspace@0__:{pattern}": self._seen})
        self._thread = self._pubsub.run_in_thread(sleep_time=0.001, daemon=True)

    def _seen(self, message: dict[str, Any]) -> None:
        now = time.monotonic()
        channel = message["channel"]
        name = channel.decode() if isinstance(channel, bytes) else channel
        self.first.setdefault(name.rsplit(":", 1)[1], now)

    def close(self) -> None:
        """Stop listening; the notifications as they were."""
        self._thread.stop()
        self._thread.join(5)
        self._pubsub.close()
        self._client.config_set("notify-keyspace-events", self._before)


def _payloads(
    codec: EventCodec, events: Iterator[tuple[str, dict[str, Any]]], count: int
) -> tuple[list[tuple[bytes, bytes, int]], dict[str, int]]:
    """``count`` encoded events keyed by order (the key's partition); each order's first index."""
    payloads: list[tuple[bytes, bytes, int]] = []
    first: dict[str, int] = {}
    for index in range(count):
        event_type, event = next(events)
        value = codec.encode(event_type, event, validated=True)
        payloads.append((value, event["order_id"].encode(), -1))
        first.setdefault(event["order_id"], index)
    return payloads, first


def _wait_ready(
    job: Job, topic: str, watch: FirstWrites, codec: EventCodec, alive: Callable[[], bool]
) -> None:
    """Place a probe order every second until the engine has written one's state."""
    producer = paced_producer(job.bootstrap)
    probes = (
        (t, e)
        for t, e in OrderSimulator(10_000, seed=3, anomaly_rate=0, order_prefix=_PROBES)
        if t == "OrderPlaced"
    )
    deadline = time.monotonic() + _READY_S
    while not any(key.startswith(_PROBES) for key in list(watch.first)):
        if time.monotonic() > deadline or not alive():
            msg = f"no probe's state within {_READY_S:.0f} s of the start"
            raise RuntimeError(msg)
        send_paced(producer, topic, _payloads(codec, probes, 1)[0], rate=1)
        time.sleep(1.0)


def _start(engine: Engine, job: Job) -> tuple[list[GroupProcess], str]:
    """The engine's processes on the latency topic (started), and the key pattern to watch."""
    if engine.name == "refold-spark":
        # As make bench's latency run: a 100 ms processing-time trigger.
        process, _registry = spark_processor(
            job, SPARK_PREFIX, "spark-latency.log", available_now=False,
            trigger_interval="100 milliseconds",
        )  # fmt: skip
        return [process.start()], f"*{SPARK_PREFIX}*:t:orders:*"
    processes, _progress = engine.processes(job)
    for process in processes:
        process.start()
    return processes, f"{engine.redis_prefix}:*"


def measure_engine_latency(
    engine: Engine, job: Job, *, rate: int, seconds: float, warmup: float
) -> tuple[LatencyResult, int]:
    """Start ``engine`` on a topic of its own, pace orders through it, time their states.

    Returns the percentiles, and how many counted orders never showed up.

    Raises:
        RuntimeError: The engine did not start, or none of the counted orders showed up.
    """
    topic = f"{job.topic}.latency.{engine.name}"
    ensure_topics(
        {"bootstrap.servers": job.bootstrap},
        [
            TopicSpec(topic, _PARTITIONS, "order_id", ORDERS_TOPIC.event_types),
            TopicSpec(f"{topic}.dlq", 1, "(key)", ("(any)",)),
        ],
    )
    codec = EventCodec()
    warm = int(rate * warmup)
    counted = int(rate * seconds)
    events = iter(
        OrderSimulator((warm + counted) // 8 + 100, seed=99, anomaly_rate=0, order_prefix=_ORDERS)
    )
    payloads, first = _payloads(codec, events, warm + counted)
    lat_job = Job(
        job.bootstrap,
        job.redis_url,
        topic,
        dict.fromkeys(((topic, p) for p in range(_PARTITIONS)), 0),
        0,
        job.work / "latency",
        run="-latency",
        java_heap=job.java_heap,
        tail=True,
    )
    watch: FirstWrites | None = None
    processes: list[GroupProcess] = []
    try:
        processes, pattern = _start(engine, lat_job)
        watch = FirstWrites(redis_client(job.redis_url), pattern)
        _wait_ready(lat_job, topic, watch, codec, lambda: all(p.alive() for p in processes))
        sent = send_paced(paced_producer(job.bootstrap), topic, payloads, rate)
        wanted = {order: index for order, index in first.items() if index >= warm}
        deadline = time.monotonic() + _DRAIN_S
        while time.monotonic() < deadline and not wanted.keys() <= watch.first.keys():
            time.sleep(0.1)
        latencies = [
            (watch.first[order] - sent[index]) * 1000
            for order, index in wanted.items()
            if order in watch.first
        ]
    except RuntimeError as exc:
        tail = processes[0].log_tail() if processes else ""
        msg = f"{engine.label}, latency run: {exc}\n{tail}"
        raise RuntimeError(msg) from exc
    finally:
        if watch is not None:
            watch.close()
        for process in processes:
            process.stop()
    if not latencies:
        msg = f"{engine.label}: none of {len(wanted)} orders showed up within {_DRAIN_S:.0f} s"
        raise RuntimeError(msg)
    return LatencyResult.of(rate, latencies), len(wanted) - len(latencies)
