"""End-to-end latency: producer send -> visible in Redis (applied position passed the offset)."""

from __future__ import annotations

import bisect
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from refold.contracts.codec import EventCodec
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator

__all__ = ["LatencyResult", "measure_latency", "paced_producer", "send_paced"]

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

    @classmethod
    def of(cls, rate: int, latencies_ms: list[float]) -> LatencyResult:
        """The percentiles of ``latencies_ms`` (sorted here; at least one)."""
        ordered = sorted(latencies_ms)
        return cls(
            rate,
            len(ordered),
            _percentile(ordered, 0.5),
            _percentile(ordered, 0.95),
            _percentile(ordered, 0.99),
            ordered[-1],
        )


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def paced_producer(bootstrap: str) -> Producer:
    """The load generator's producer: acknowledged by all replicas, batched for 20 ms."""
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": _LINGER_MS,
            "partitioner": "murmur2_random",
        }
    )


def send_paced(
    producer: Producer,
    topic: str,
    payloads: Sequence[tuple[bytes, bytes, int]],
    rate: int,
    on_delivery: Callable[[int, KafkaError | None, Message], None] | None = None,
) -> list[float]:
    """Send ``payloads`` (value, key, partition; -1: the key's) at ``rate`` a second; flush.

    What is due is sent every 20 ms. Returns when each payload was sent (``time.monotonic()``);
    ``on_delivery(index, err, msg)`` is called as each is acknowledged.

    Encode the payloads up front: on 2 cores the load generator competes with the system under
    test, so it does as little as possible while the clock runs.
    """
    sent = [0.0] * len(payloads)
    start = time.monotonic()
    index = 0
    while index < len(payloads):
        now = time.monotonic()
        due = min(len(payloads), int((now - start) * rate) + 1)
        for i in range(index, due):
            value, key, partition = payloads[i]
            sent[i] = now
            callback = None if on_delivery is None else functools.partial(on_delivery, i)
            if partition < 0:
                producer.produce(topic, value, key, on_delivery=callback)
            else:
                producer.produce(topic, value, key, partition=partition, on_delivery=callback)
        index = due
        producer.poll(0)
        time.sleep(_TICK_S)
    producer.flush(30)
    return sent


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
    producer = paced_producer(bootstrap)
    acked: list[tuple[int, int, int]] = []  # partition, offset, payload index
    visible: dict[tuple[int, int], float] = {}
    stop = threading.Event()

    def _acked(index: int, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked.append((msg.partition() or 0, msg.offset() or 0, index))

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

    payloads = []
    for _ in range(int(rate * seconds)):
        event_type, event = next(events)
        value = codec.encode(event_type, event, validated=True)
        payloads.append((value, event["order_id"].encode(), -1))
    poller = threading.Thread(target=_poll_positions, daemon=True)
    poller.start()
    sent = send_paced(producer, topic, payloads, rate, _acked)
    deadline = time.monotonic() + 30
    last: dict[int, int] = {}
    for partition, offset, _index in acked:
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
    for partition, offset, index in acked:
        positions_seen, times = by_partition.get(partition, ([], []))
        found = bisect.bisect_right(positions_seen, offset)  # first position > offset
        if found < len(times):
            latencies.append((times[found] - sent[index]) * 1000)
    if not latencies:
        msg = (
            f"none of the {len(acked)} acknowledged events became visible in Redis within 30 s "
            "of the last send: the processor is not applying them"
        )
        raise RuntimeError(msg)
    return LatencyResult.of(rate, latencies)
