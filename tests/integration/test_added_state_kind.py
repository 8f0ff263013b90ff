"""A kind of state added as a module, as a user would: no edit to the transaction or the runner.

The kind (a top-k: orders per customer in a sorted set) is one class that stages a chunk's
changes and writes them in the fold's transaction, and its registration. Folded live in small
chunks and rebuilt in one go it matches a plain-Python count (the oracle); a snapshot seeded
into a new generation is equal to it; ``replay diff`` compares it with the kind's own diff and
sees a changed score; an in-place reset empties it; gc removes it with its generation.
"""

from __future__ import annotations

import dataclasses
import types
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import redis
from redis.client import Pipeline

from refold.contracts.codec import EventCodec
from refold.contracts.layout import GenerationKeys
from refold.contracts.processors import ProcessorSpec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.scan import scan_names
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime import kinds
from refold.processors.runtime.dead_letters import DeadLetter
from refold.processors.runtime.envelope import BatchOutcome, FoldWriter
from refold.processors.runtime.fold_target import PendingRecord
from refold.processors.runtime.kinds import FoldContext, register_kind
from refold.processors.runtime.output_transactions import Outbox
from refold.replay.generations_admin import collect_garbage, diff_generations
from refold.replay.in_place import _reset_state
from refold.replay.snapshots import SnapshotStore

CODEC = EventCodec()
KIND = "topk"


class TopCustomers:
    """The user's fold: who places the most orders."""

    name = "top_customers"
    event_types = ("OrderPlaced",)
    top = "customers"  # what makes it a top-k fold: the sorted set it ranks into

    def item(self, event_type: str, event: Mapping[str, Any]) -> str:
        return str(event["customer_id"])


class _StagedTop:
    def __init__(self, key: str, counts: Counter[str]) -> None:
        self.key = key
        self.counts = counts

    def send_effects(self, outbox: Outbox) -> None:
        """A ranking sends nothing."""

    def write(self, pipe: Pipeline) -> None:
        for item, count in sorted(self.counts.items()):
            pipe.zincrby(self.key, count, item)


class TopKind:
    """The kind: each record adds one to its item's score."""

    keyed = False  # a ranking adds up across partitions, as windows do

    def __init__(self, context: FoldContext) -> None:
        self.context = context
        self.fold: Any = context.projection

    def stage(
        self,
        pipe: Pipeline,
        pending: Sequence[PendingRecord],
        watermarks: Sequence[int | None],
        dead: list[DeadLetter],
        outcome: BatchOutcome,
    ) -> _StagedTop:
        counts: Counter[str] = Counter()
        for _record, event_type, data, _entity in pending:
            counts[self.fold.item(event_type, data)] += 1
            outcome.applied += 1
        return _StagedTop(self.context.target.keys.kind_key(KIND, self.fold.top), counts)


def _scores(client: redis.Redis, keys: GenerationKeys) -> dict[str, dict[str, float]]:
    head = len(keys.base) + 1
    return {
        name[head:]: {m.decode(): s for m, s in client.zrange(name, 0, -1, withscores=True)}
        for name in scan_names(client, keys.kind_pattern(KIND))
    }


def diff_top(
    client: redis.Redis, a: GenerationKeys, b: GenerationKeys
) -> dict[str, tuple[Any, Any]]:
    in_a, in_b = _scores(client, a), _scores(client, b)
    return {
        k: (in_a.get(k), in_b.get(k))
        for k in in_a.keys() | in_b.keys()
        if in_a.get(k) != in_b.get(k)
    }


@pytest.fixture
def top_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kind registered for this test only (the registry is process-wide)."""
    monkeypatch.setattr(kinds.base, "_KINDS", list(kinds.base._KINDS))
    monkeypatch.setattr(kinds.base, "_DIFFS", dict(kinds.base._DIFFS))
    register_kind(KIND, lambda fold: hasattr(fold, "top"), TopKind, diff=diff_top)


def _records() -> tuple[list[SourceRecord], Counter[str]]:
    records, offsets, oracle = [], Counter[int](), Counter[str]()
    for event_type, event in OrderSimulator(150, seed=5, anomaly_rate=0):
        partition = zlib.crc32(event["order_id"].encode()) % 2
        value = CODEC.encode(event_type, event)
        records.append(
            SourceRecord("orders", partition, offsets[partition], event["order_id"].encode(), value)
        )
        offsets[partition] += 1
        if event_type == "OrderPlaced":
            oracle[event["customer_id"]] += 1
    return records, oracle


def test_a_kind_added_as_a_module_folds_replays_snapshots_diffs_resets_and_is_collected(
    target, redis_url, top_kind, tmp_path
):
    records, oracle = _records()
    chosen = dataclasses.replace(target, processor="top_customers", topics=("orders",))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, chosen.processor, chosen.key_prefix)
    live = registry.create({"topics": ["orders"]}, live=True)
    writer = FoldWriter(dataclasses.replace(chosen, generation=live), TopCustomers())
    applied = sum(writer.apply(records[i : i + 37]).applied for i in range(0, len(records), 37))
    writer.apply(records[:50])  # a batch run again: nothing twice
    assert applied == sum(oracle.values())
    expected = {f"x:{KIND}:customers": {c: float(n) for c, n in oracle.items()}}
    assert _scores(client, registry.keys(live)) == expected

    rebuilt = registry.create({"topics": ["orders"]})
    FoldWriter(dataclasses.replace(chosen, generation=rebuilt), TopCustomers()).apply(records)
    spec = ProcessorSpec(
        name=chosen.processor, projection="x:y", topics=("orders",), key="k", tables=()
    )
    assert diff_generations(spec, client, chosen.key_prefix, live, rebuilt).identical

    store = SnapshotStore(registry)
    seeded = registry.create({"topics": ["orders"]})
    store.seed(store.take(live), seeded)
    assert _scores(client, registry.keys(seeded)) == expected
    client.zincrby(registry.keys(seeded).kind_key(KIND, "customers"), 1, "cus-new")
    changed = diff_generations(spec, client, chosen.key_prefix, live, seeded)
    assert not changed.identical
    assert changed.kinds_differing[KIND][f"x:{KIND}:customers"][1]["cus-new"] == 1.0
    assert f"{KIND} x:{KIND}:customers" in changed.render()

    begin = types.SimpleNamespace(topic="orders", partition=0, begin=0)
    _reset_state(registry, seeded, types.SimpleNamespace(partitions=[begin]), None)
    assert _scores(client, registry.keys(seeded)) == {}
    registry.flip(rebuilt)
    collect_garbage(spec, client, chosen.key_prefix, str(tmp_path), execute=True)
    assert _scores(client, registry.keys(live)) == {}  # retired, then collected
    assert _scores(client, registry.keys(rebuilt)) == expected
