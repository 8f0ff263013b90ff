"""What a chained processor must see: order_state's status changes, from a plain fold."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from refold.processors.fold.projection import (
    EventRejectedError,
    State,
    UnstorableStateError,
    fold_one,
)
from refold.processors.order_state.projection import OrderStateProjection, status_change


def status_changes(events: Iterable[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, str]]:
    """(customer, status) -> how often an order of the customer moved to that status.

    The events in publishing order: each order's events are on one partition, so this is the
    order order_state folds them in.
    """
    projection = OrderStateProjection()
    states: dict[str, State] = {}
    out: Counter[tuple[str, str]] = Counter()
    for event_type, event in events:
        key = projection.key(event_type, event)
        try:
            new, *_rest = fold_one(projection, states.get(key), event_type, event)
        except (EventRejectedError, UnstorableStateError):
            continue  # rejected events change nothing (the oracle's rule)
        change = status_change(states.get(key), new)
        if change is not None:
            out[(change["customer_id"], change["status"])] += 1
        states[key] = new
    return out


def senders(kafka: str, topic: str, isolation: str) -> list[bytes]:
    """Who sent each record of ``topic``, as a reader with ``isolation`` sees them."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "test-reader",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    ids, eofs = [], set()
    while len(eofs) < len(partitions):
        message = consumer.poll(10)
        assert message is not None, "the topic was not read to its end"
        if message.error():
            eofs.add(message.partition())
            continue
        headers = message.headers() or []
        # An output's origin id; a dead letter's origin: its record and its reason.
        ids.append(dict(headers).get("refold.origin.id") or repr(sorted(headers)).encode())
    consumer.close()
    return ids
