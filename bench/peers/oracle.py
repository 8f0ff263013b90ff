"""The correctness check: each engine's final states against refold's plain-Python oracle.

The oracle is :func:`refold.processors.fold.oracle.fold_all` over the log as it is (read back
from the broker and decoded with refold's codec, in each partition's order: orders are keyed,
so an order's events are in one partition). A peer's states come from its states files, its
store's changelog topics (Quix Streams) or Redis; all are JSON, so they are compared as JSON
values.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.store.scan import scan_batches
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.projection import State
from refold.processors.order_state.projection import OrderStateProjection

__all__ = [
    "Verdict",
    "changelog_states",
    "compare",
    "log_events",
    "merged_states",
    "oracle_states",
    "redis_states",
]

_CHANGELOG_S = 300.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an engine's final states compare with the oracle's."""

    expected: int
    missing: int  # keys the oracle has and the engine not
    extra: int  # keys the engine has and the oracle not
    different: int  # keys whose states differ

    @property
    def ok(self) -> bool:
        """Every state exactly the oracle's."""
        return self.missing == self.extra == self.different == 0

    def __str__(self) -> str:
        if self.ok:
            return f"ok ({self.expected:,} states)"
        return (
            f"FAILED ({self.different:,} differ, {self.missing:,} missing, {self.extra:,} extra "
            f"of {self.expected:,})"
        )


def compare(expected: Mapping[str, State], got: Mapping[str, Any]) -> Verdict:
    """``got`` (JSON values by key) against the oracle's ``expected`` states."""
    missing = sum(1 for key in expected if key not in got)
    extra = sum(1 for key in got if key not in expected)
    different = sum(
        1
        for key, state in expected.items()
        if key in got and orjson.loads(orjson.dumps(state)) != got[key]
    )
    return Verdict(len(expected), missing, extra, different)


def log_events(
    bootstrap: str, ends: Mapping[tuple[str, int], int]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of the backlog, decoded, partition after partition, in log order."""
    codec = EventCodec()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "refold-bench-peers-oracle",  # never joined: assign() only
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        for (topic, partition), end in sorted(ends.items()):
            if end <= 0:
                continue
            consumer.assign([TopicPartition(topic, partition, 0)])
            offset = -1
            while offset + 1 < end:
                for message in consumer.consume(10_000, timeout=1.0):
                    if message.error() is not None:
                        continue
                    offset = message.offset() or 0  # a consumed record always has one
                    event = codec.decode(message.value())
                    yield event.event_type, event.data
    finally:
        consumer.close()


def oracle_states(events: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, State]:
    """order_state's final states, folded the plain way."""
    return fold_all(OrderStateProjection(), events).states


def merged_states(paths: Iterable[Path]) -> dict[str, Any]:
    """The states files of one engine's processes: per key, the state of the highest offset."""
    best: dict[str, tuple[int, Any]] = {}
    for path in paths:
        for key, (offset, state) in orjson.loads(path.read_bytes()).items():
            if key not in best or offset > best[key][0]:
                best[key] = (offset, state)
    return {key: state for key, (_offset, state) in best.items()}


def redis_states(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """The states a Redis variant wrote under ``prefix:<key>``."""
    out: dict[str, Any] = {}
    for names in scan_batches(client, f"{prefix}:*"):
        for name, value in zip(names, client.mget(names), strict=True):
            if value is not None:
                out[name.removeprefix(f"{prefix}:")] = orjson.loads(value)
    return out


def changelog_states(bootstrap: str, group: str, state_key: bytes = b'"order"') -> dict[str, Any]:
    """The states a Quix Streams app of consumer group ``group`` holds, read from its changelogs.

    Quix backs each store partition with a compacted changelog topic,
    ``changelog__<group>--<topic>--<store>``: each record's key is the message key (JSON, as
    Quix serializes a state's prefix), ``|`` and the state key (JSON), its value the state
    (JSON). The newest value per key is the store's
    content once the app has committed (read_committed: its last transaction included).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "refold-bench-peers-changelog",  # never joined: assign() only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out: dict[str, Any] = {}
    try:
        topics = consumer.list_topics(timeout=10).topics
        parts = [
            TopicPartition(name, p, OFFSET_BEGINNING)
            for name, meta in topics.items()
            if name.startswith(f"changelog__{group}--")
            for p in meta.partitions
        ]
        if not parts:
            return out
        consumer.assign(parts)
        open_parts = {(tp.topic, tp.partition) for tp in parts}
        suffix = b"|" + state_key
        deadline = time.monotonic() + _CHANGELOG_S
        while open_parts:
            if time.monotonic() > deadline:
                msg = f"the changelogs of {group} did not end within {_CHANGELOG_S:.0f} s"
                raise RuntimeError(msg)
            for message in consumer.consume(10_000, timeout=5.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - its public name
                        open_parts.discard((message.topic(), message.partition()))
                    continue
                key, value = message.key() or b"", message.value()
                if key.endswith(suffix):
                    name = str(orjson.loads(key[: -len(suffix)]))
                    if value is None:
                        out.pop(name, None)
                    else:
                        out[name] = orjson.loads(value)
    finally:
        consumer.close()
    return out
