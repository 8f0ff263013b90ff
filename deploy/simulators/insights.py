"""Critical insights as a pattern processor writes them: Avro ``Insight`` records with origins.

For tests, benchmarks and the demo of webhook delivery. Each record is single-object encoded
(:class:`~refold.contracts.codec.EventCodec`), keyed by the pattern's key, and carries the headers
every processor output carries (:mod:`refold.contracts.origin`): ``refold.origin.id``
(deterministic), the source record's topic, partition and offset, ``refold.processor`` and
``refold.generation``. Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from refold.contracts.codec import EventCodec
from refold.contracts.insights import INSIGHT
from refold.contracts.kafka.outputs import Deliveries, output_producer
from refold.contracts.origin import ORIGIN_ID, Headers, origin_headers, origin_id

__all__ = ["SimulatedInsight", "insights", "produce_insights"]

_PATTERNS = (
    ("card-testing", "count"),
    ("payment-then-cancel", "sequence"),
    ("paid-not-shipped", "absence"),
)
_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class SimulatedInsight:
    """One insight record: its key, fields and headers."""

    key: str
    fields: dict[str, Any]
    headers: Headers

    @property
    def origin_id(self) -> str:
        """The ``refold.origin.id`` header (the webhook's Idempotency-Key)."""
        for name, value in self.headers:
            if name == ORIGIN_ID and isinstance(value, bytes):
                return value.decode()
        return ""


def insights(
    count: int,
    *,
    processor: str = "order_patterns",
    source_topic: str = "commerce.orders",
    source_partitions: int = 4,
    generation: int = 1,
    seed: int = 0,
    key_prefix: str = "customer-",
    warning_every: int = 0,
) -> Iterator[SimulatedInsight]:
    """``count`` insights of ``processor``, in the order it would produce them.

    Every ``warning_every``-th one (0: none) has severity ``warning``, the others ``critical``.
    """
    rng = random.Random(seed)  # noqa: S311 - test data, not security
    offsets = [0] * source_partitions
    now = _START_MS
    for n in range(count):
        partition = n % source_partitions
        offsets[partition] += rng.randint(1, 40)
        offset = offsets[partition]
        pattern, kind = _PATTERNS[rng.randrange(len(_PATTERNS))]
        key = f"{key_prefix}{rng.randint(1, 2_000):05d}"
        now += rng.randint(50, 5_000)
        events = rng.randint(2, 6)
        fields = {
            "insight_id": f"{processor}/{pattern}/{key}/{now}/0",
            "processor": processor,
            "pattern": pattern,
            "kind": kind,
            "key": key,
            "severity": "warning" if warning_every and n % warning_every == 0 else "critical",
            "detected_at": now,
            "first_at": now - rng.randint(1_000, 600_000),
            "event_count": events,
            "events": [f"evt-{seed}-{n}-{i}" for i in range(events)],
            "details": {"source_offset": str(offset)},
        }
        headers: Headers = [
            (ORIGIN_ID, origin_id(processor, source_topic, partition, offset, 0).encode()),
            *origin_headers(source_topic, partition, offset, processor, generation),
        ]
        yield SimulatedInsight(key, fields, headers)


def produce_insights(
    bootstrap_servers: str,
    topic: str,
    records: list[SimulatedInsight],
    *,
    codec: EventCodec | None = None,
    per_transaction: int = 0,
) -> None:
    """Produce ``records`` to ``topic`` (acks=all) and wait for every acknowledgement.

    Args:
        bootstrap_servers: The broker.
        topic: The insight topic.
        records: The insights, produced in this order.
        codec: The codec to encode them with.
        per_transaction: When set, produce them in Kafka transactions of this many records, as
            a processor writes its outputs: each transaction ends with a commit marker, which
            takes an offset no consumer reads.

    Raises:
        DeadLetterError: The broker did not acknowledge them all.
    """
    codec = codec or EventCodec()
    kafka = {"bootstrap.servers": bootstrap_servers}
    if per_transaction:
        kafka["transactional.id"] = f"refold-simulated-insights.{topic}"
    producer = output_producer(kafka)
    if per_transaction:
        producer.init_transactions()
    step = per_transaction or max(1, len(records))
    for start in range(0, len(records), step):
        sent = Deliveries(producer, f"{len(records[start : start + step])} insights")
        if per_transaction:
            producer.begin_transaction()
        for record in records[start : start + step]:
            sent.produce(
                topic, codec.encode(INSIGHT, record.fields), record.key.encode(), record.headers
            )
        sent.wait()
        if per_transaction:
            producer.commit_transaction()
