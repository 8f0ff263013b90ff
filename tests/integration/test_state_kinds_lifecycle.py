"""Every state kind goes through snapshots, seeding, diff, in-place resets and gc (real Redis).

The envelope writes window buckets and their sketches, close/expiry/entity/lookup timers and
event-time clocks besides entity tables and aggregates. Each is a namespace of the layout, and
snapshots, resets and gc derive their key lists from it: a kind declared there is never left
behind. Per kind: a snapshot seeded into a new generation is byte-identical to the original,
``replay diff`` sees them equal (and sees a changed bucket), an in-place reset empties them, and
gc of the retired generation leaves no key.
"""

from __future__ import annotations

import dataclasses
import types
import zlib

import pytest
import redis

from refold.contracts.codec import EventCodec
from refold.contracts.processors import ProcessorSpec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.enriched_clicks.config import ENRICHED_CLICKS
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.web_sessions.config import WEB_SESSIONS
from refold.processors.web_sessions.projection import WebSessionsProjection
from refold.replay.generations_admin import collect_garbage, diff_generations
from refold.replay.in_place import _reset_state
from refold.replay.snapshots import SnapshotStore

CODEC = EventCodec()


def _records(events, key, topic_of):
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for event_type, event in events:
        topic = topic_of(event_type)
        if topic is None:
            continue
        partition = zlib.crc32(event[key].encode()) % 2
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        out.append(
            SourceRecord(
                topic, partition, offset, event[key].encode(), CODEC.encode(event_type, event)
            )
        )
    return out


def _windows(target: FoldTarget) -> tuple[FoldTarget, object, list, tuple[str, ...]]:
    events = list(OrderSimulator(200, seed=2, anomaly_rate=0))
    records = _records(events, "order_id", lambda _t: "orders")
    chosen = dataclasses.replace(
        target, processor="sales_windows", event_time=SALES_WINDOWS.event_time, topics=("orders",)
    )
    return chosen, SalesWindows(), records, ("w:", "wd:", "tm:close", "tm:expire", "wm:")


def _timers(target: FoldTarget) -> tuple[FoldTarget, object, list, tuple[str, ...]]:
    events = list(ClickstreamSimulator(60, seed=2, long_gap_rate=0.3))
    topics = {"PageViewed": "pv", "SearchPerformed": "se", "SearchResultClicked": "se"}
    records = _records(events, "session_id", topics.get)
    chosen = dataclasses.replace(
        target, processor="web_sessions", event_time=WEB_SESSIONS.event_time, topics=("pv", "se")
    )
    return chosen, WebSessionsProjection(), records, ("t:", "a:", "tm:p:", "wm:")


def _lookups(target: FoldTarget) -> tuple[FoldTarget, object, list, tuple[str, ...]]:
    events = list(ClickstreamSimulator(60, seed=2))
    records = _records(events, "session_id", lambda t: "se" if t == "SearchResultClicked" else None)
    chosen = dataclasses.replace(
        target, processor="enriched_clicks", event_time=ENRICHED_CLICKS.event_time, topics=("se",)
    )
    return chosen, EnrichedClicksProjection(), records, ("tm:lookup", "wm:")


class _StatusCounts:
    """A processor of an output stream (origin ids): status changes counted per customer."""

    name = "customer_changes"
    table = "customers"
    aggregate = "changes"
    event_types = ("OrderStatusChanged",)

    def key(self, event_type, event):
        return event["customer_id"]

    def apply(self, state, event_type, event):
        return {"n": (state or {"n": 0})["n"] + 1}

    def contribution(self, state):
        return {"changes": state["n"]}


def _chained(target: FoldTarget) -> tuple[FoldTarget, object, list, tuple[str, ...]]:
    records = []
    for offset in range(40):
        customer = f"cus-{offset % 7}"
        change = {
            "order_id": f"o-{offset}",
            "customer_id": customer,
            "status": "paid",
            "previous_status": "placed",
            "currency": "EUR",
            "total_minor": 100,
            "changed_at": 1_767_225_600_000 + offset,
        }
        records.append(
            SourceRecord(
                "changes",
                zlib.crc32(customer.encode()) % 2,
                offset,
                customer.encode(),
                CODEC.encode("OrderStatusChanged", change),
                0,
                f"order_state|orders/{offset % 3}@{offset}.0",
            )
        )
    per_partition: dict[int, int] = {}
    for i, record in enumerate(records):  # offsets per partition, in order
        records[i] = record._replace(offset=per_partition.get(record.partition, 0))
        per_partition[record.partition] = records[i].offset + 1
    chosen = dataclasses.replace(target, processor="customer_changes", topics=("changes",))
    return chosen, _StatusCounts(), records, ("t:", "a:", "om:")


def _state(client: redis.Redis, registry: GenerationRegistry, generation: int) -> dict:
    """Every state key of a generation (without its base) -> its DUMP."""
    keys = registry.keys(generation)
    names = [
        n.decode()
        for n in client.scan_iter(match=keys.pattern(), count=1000)
        if keys.is_state_key(n.decode())
    ]
    return {n[len(keys.base) + 1 :]: client.dump(n) for n in names}


@pytest.mark.parametrize(
    "kind",
    [_windows, _timers, _lookups, _chained],
    ids=["windows", "timers", "lookups", "origin-marks"],
)
def test_snapshot_seed_diff_reset_and_gc_cover_every_state_kind(target, redis_url, kind, tmp_path):
    chosen, fold, records, namespaces = kind(target)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, chosen.processor, chosen.key_prefix)
    first = registry.create({"topics": list(chosen.topics)}, live=True)
    FoldWriter(dataclasses.replace(chosen, generation=first), fold).apply(records)
    state = _state(client, registry, first)
    for namespace in namespaces:  # every kind of this processor is there...
        assert any(name.startswith(namespace) for name in state), (namespace, sorted(state)[:5])

    # ... is snapshotted and seeded byte for byte,
    store = SnapshotStore(registry)
    snapshot = store.take(first)
    second = registry.create({"topics": list(chosen.topics)})
    store.seed(snapshot, second)
    assert _state(client, registry, second) == state
    # ... compared by replay diff,
    spec = ProcessorSpec(
        name=chosen.processor,
        projection="x:y",
        topics=chosen.topics,
        key="k",
        tables=(getattr(fold, "table", None),) if getattr(fold, "table", None) else (),
        aggregates=(fold.aggregate,) if getattr(fold, "aggregate", None) else (),
    )
    assert diff_generations(spec, client, chosen.key_prefix, first, second).identical
    if kind is _windows:
        bucket = next(n for n in state if n.startswith("w:"))
        client.hincrby(f"{registry.keys(second).base}:{bucket}", "count", 1)
        assert not diff_generations(spec, client, chosen.key_prefix, first, second).identical
    # ... emptied by an in-place reset (to the earliest offsets),
    begin = types.SimpleNamespace(topic=chosen.topics[0], partition=0, begin=0)
    removed = _reset_state(registry, second, types.SimpleNamespace(partitions=[begin]), None)
    assert removed == len(state)
    assert list(_state(client, registry, second)) == ["positions"]  # where folding restarts
    # ... and gone with its generation at gc.
    registry.flip(second)
    assert registry.status(first) == "retired"
    collect_garbage(spec, client, chosen.key_prefix, str(tmp_path), execute=True)
    assert list(client.scan_iter(match=registry.keys(first).pattern())) == []
