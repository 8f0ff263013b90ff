"""End-to-end latency: producer send -> visible in Redis (applied position passed the offset)."""

from __future__ import annotations

import bisect
import functools
import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from refold.contracts.codec import EventCodec
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator

__all__ = ["LatencyResult", "measure_latency"]

_POLL_S = 0.005  # visibility is sampled every 5 ms
# The producer sends what is due every 20 ms and batches for up to 20 ms (linger.ms), as a
# fleet of producers would; the batching wait is inside the measured latency.
_TICK_S = 0.02
_LINGER_MS = 20


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Latency percentiles in milliseconds over ``events`` paced events."""

    rate: int
    events: int
    p50: float
    p95: float
    p99: float
    max: float


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def measure_latency(
    bootstrap: str,
    topic: str,
    registry: GenerationRegistry,
    generation: int,
    *,
    rate: int,
    seconds: float,
    seed: int = 99,
    order_prefix: str = "lat-",
) -> LatencyResult:
    """Produce at ``rate`` events/s for ``seconds`` and time each event until it is applied.

    The processor must already be running on ``generation`` and caught up.
    """
    codec = EventCodec()
    events = iter(
        OrderSimulator(
            int(rate * seconds / 8) + 100, seed=seed, anomaly_rate=0, order_prefix=order_prefix
        )
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": _LINGER_MS,
            "partitioner": "murmur2_random",
        }
    )
    sent: dict[int, float] = {}
    acked: list[tuple[int, int, float]] = []  # partition, offset, send time
    visible: dict[tuple[int, int], float] = {}
    stop = threading.Event()

    def _acked(index: int, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked.append((msg.partition() or 0, msg.offset() or 0, sent[index]))

    def _poll_positions() -> None:
        seen: dict[int, int] = {}
        while not stop.is_set():
            positions, _batch = registry.positions(generation)
            now = time.monotonic()
            for (_t, partition), offset in positions.items():
                if offset > seen.get(partition, 0):
                    visible[(partition, offset)] = now
                    seen[partition] = offset
            time.sleep(_POLL_S)

    # Encoded up front and sent in 5 ms ticks: on 2 cores the load generator competes with the
    # system under test, so it does as little as possible while the clock runs.
    total = int(rate * seconds)
    payloads = []
    for _ in range(total):
        event_type, event = next(events)
        payloads.append(
            (codec.encode(event_type, event, validated=True), event["order_id"].encode())
        )
    poller = threading.Thread(target=_poll_positions, daemon=True)
    poller.start()

    start = time.monotonic()
    index = 0
    while index < total:
        now = time.monotonic()
        due = min(total, int((now - start) * rate) + 1)
        for i in range(index, due):
            value, key = payloads[i]
            sent[i] = now
            producer.produce(topic, value, key, on_delivery=functools.partial(_acked, i))
        index = due
        producer.poll(0)
        time.sleep(_TICK_S)
    producer.flush(30)
    deadline = time.monotonic() + 30
    last: dict[int, int] = {}
    for partition, offset, _sent in acked:
        last[partition] = max(offset, last.get(partition, -1))
    while time.monotonic() < deadline:
        positions, _batch = registry.positions(generation)
        if all(positions.get((topic, p), 0) > o for p, o in last.items()):
            break
        time.sleep(0.05)
    time.sleep(0.05)
    stop.set()
    poller.join()
    # An event is visible at the first sample whose position passed its offset.
    by_partition: dict[int, tuple[list[int], list[float]]] = {}
    for (partition, position), when in sorted(visible.items()):
        positions_seen, times = by_partition.setdefault(partition, ([], []))
        positions_seen.append(position)
        times.append(when)
    latencies = []
    for partition, offset, sent_at in acked:
        positions_seen, times = by_partition.get(partition, ([], []))
        index = bisect.bisect_right(positions_seen, offset)  # first position > offset
        if index < len(times):
            latencies.append((times[index] - sent_at) * 1000)
    latencies.sort()
    if not latencies:
        msg = (
            f"none of the {len(acked)} acknowledged events became visible in Redis within 30 s "
            "of the last send: the processor is not applying them"
        )
        raise RuntimeError(msg)
    return LatencyResult(
        rate,
        len(latencies),
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.95),
        _percentile(latencies, 0.99),
        latencies[-1],
    )
