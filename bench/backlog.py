"""The benchmark's backlogs: order events, and the clickstream with its customer accounts.

Both are produced before any processor starts, to topics of the benchmark's own (``bench.*``,
with the partition counts and keys of the reference topics), so each run catches up on exactly
the same records.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

from confluent_kafka import Producer

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.progress import progress_bar
from refold.contracts.topics import TopicSpec
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator, SimulatedEvent

__all__ = [
    "CUSTOMERS_TOPIC",
    "EMPTY_CUSTOMERS_TOPIC",
    "ORDERS_TOPIC",
    "PAGEVIEWS_TOPIC",
    "SEARCHES_TOPIC",
    "TOPICS",
    "produce_clickstream",
    "produce_order_steps",
    "produce_orders",
]


def _bench(spec: TopicSpec, name: str) -> TopicSpec:
    """``spec`` (partitions, key, event types) under a benchmark topic name."""
    return TopicSpec(name, spec.partitions, spec.key_field, spec.event_types)


ORDERS_TOPIC = _bench(ORDERS, "bench.orders")
# customer_stats' second topic when only the order backlog should count: the re-keyed run
# then folds exactly the records order_state folds.
EMPTY_CUSTOMERS_TOPIC = _bench(CUSTOMERS, "bench.customers.empty")
PAGEVIEWS_TOPIC = _bench(PAGEVIEWS, "bench.pageviews")
SEARCHES_TOPIC = _bench(SEARCHES, "bench.searches")
CUSTOMERS_TOPIC = _bench(CUSTOMERS, "bench.customers")
TOPICS = (ORDERS_TOPIC, EMPTY_CUSTOMERS_TOPIC, PAGEVIEWS_TOPIC, SEARCHES_TOPIC, CUSTOMERS_TOPIC)

# Measured on the simulator (20k sessions: 132k web events, 7k account events): sizes the
# session count for a wanted number of web events, and the progress bar.
_WEB_EVENTS_PER_SESSION = 6.6
_ACCOUNT_EVENTS_PER_SESSION = 0.35
_SEED = 2026
_PROGRESS_EVERY = 10_000


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "partitioner": "murmur2_random",
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def _send(
    bootstrap: str, records: Iterable[tuple[str, bytes, bytes]], total: int, desc: str
) -> int:
    """Produce ``(topic, key, value)`` records; waits until the broker acknowledged them all."""
    producer = _producer(bootstrap)
    count = 0
    with progress_bar(total=total, unit="ev", desc=desc) as bar:
        for topic, key, value in records:
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
            if count % _PROGRESS_EVERY == 0:
                producer.poll(0)
                bar.update(_PROGRESS_EVERY)
        bar.update(count % _PROGRESS_EVERY)
    if producer.flush(120):
        msg = "the broker did not acknowledge every benchmark event"
        raise RuntimeError(msg)
    return count


def _encoded(
    events: Iterable[SimulatedEvent], routes: dict[str, TopicSpec]
) -> Iterator[tuple[str, bytes, bytes]]:
    codec = EventCodec()
    for event_type, event in events:
        spec = routes[event_type]
        value = codec.encode(event_type, event, validated=True)
        yield spec.name, str(event[spec.key_field]).encode(), value


def _orders(events: int) -> OrderSimulator:
    return OrderSimulator(events // 9 + 1, seed=_SEED)


def produce_orders(bootstrap: str, events: int) -> int:
    """Produce ``events`` order events to :data:`ORDERS_TOPIC`; returns how many."""
    routes = dict.fromkeys(ORDERS_TOPIC.event_types, ORDERS_TOPIC)
    records = itertools.islice(_encoded(_orders(events), routes), events)
    return _send(bootstrap, records, events, "orders")


def produce_order_steps(bootstrap: str, sizes: Sequence[int]) -> Iterator[int]:
    """Produce one stream of order events to :data:`ORDERS_TOPIC` in steps, up to each size.

    The stream is the one :func:`produce_orders` produces for the largest of ``sizes``; each
    step appends its next records, so the topic holds the stream's first ``size`` events after
    the step (an order may span two steps, as it would span two hours of a shop's log).

    Yields:
        The events in the topic after each step, smallest size first (the generator produces
        the next step only when asked for it).
    """
    ordered = sorted(set(sizes))
    routes = dict.fromkeys(ORDERS_TOPIC.event_types, ORDERS_TOPIC)
    records = _encoded(_orders(ordered[-1]), routes)
    done = 0
    for size in ordered:
        step = itertools.islice(records, size - done)
        done += _send(bootstrap, step, size - done, f"orders to {size:,}")
        yield done


def produce_clickstream(bootstrap: str, web_events: int, order_events: int) -> int:
    """Produce about ``web_events`` clickstream events plus their customers' account events.

    Signed-in sessions are by the customers of the order backlog of ``order_events`` (the same
    simulator and seed), so customer_stats finds the profiles of its customers.

    Returns:
        How many events were produced, account events included.
    """
    sessions = max(1, round(web_events / _WEB_EVENTS_PER_SESSION))
    simulator = ClickstreamSimulator(
        sessions, seed=_SEED, customer_ids=_orders(order_events).customer_ids
    )
    routes = {
        event_type: spec
        for spec in (PAGEVIEWS_TOPIC, SEARCHES_TOPIC, CUSTOMERS_TOPIC)
        for event_type in spec.event_types
    }
    estimate = round(sessions * (_WEB_EVENTS_PER_SESSION + _ACCOUNT_EVENTS_PER_SESSION))
    return _send(bootstrap, _encoded(simulator, routes), estimate, "clickstream")
