"""Dead letters once over every generation (issue 44 item 3), on real Redis and a real broker.

A processor's life with four generations, its writer driven without Spark: a live generation
that is snapshotted, a replay from an offset (seeded from the snapshot), a full replay killed
half way (and collected by gc), a full replay, and a rollback over it. Each bad record
must be on the dead-letter topic exactly once per reason, and every bad record must be there.

Before the ``dl:sent`` ledger, the rule held only against the index of the generation that was
live when a rebuild started: the live generation sent again what the killed rebuild had sent
ahead of it, and the generation rolled back to sent again what the full rebuild had sent.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.replay.generations_admin import collect_garbage, rollback, unregistered_spec
from refold.replay.snapshots import SnapshotStore
from tests.support.dead_letters import dlq_letters

PARTITIONS = 2
TOPIC = "orders"


def _records() -> list[SourceRecord]:
    """order_state's log: every 61st record is not Avro, and the fold refuses some others."""
    codec = EventCodec()
    offsets = [0] * PARTITIONS
    out = []
    for n, (event_type, event) in enumerate(OrderSimulator(400, seed=44, anomaly_rate=0.05)):
        partition = zlib.crc32(event["order_id"].encode()) % PARTITIONS
        value = b"not avro" if n % 61 == 0 else codec.encode(event_type, event)
        out.append(
            SourceRecord(TOPIC, partition, offsets[partition], event["order_id"].encode(), value)
        )
        offsets[partition] += 1
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _upto(records: list[SourceRecord], share: float) -> list[SourceRecord]:
    """Each partition's records below ``share`` of its length (a log read that far)."""
    ends = Counter(r.partition for r in records)
    return [r for r in records if r.offset < share * ends[r.partition]]


def _at(records: list[SourceRecord], share: float) -> dict[str, int]:
    """The positions of a generation that starts at ``share`` of each partition."""
    ends = Counter(r.partition for r in records)
    return {f"{TOPIC}/{p}": int(share * n) for p, n in ends.items()}


def test_each_bad_record_is_dead_lettered_once_over_every_generation(
    target: FoldTarget, redis_url, kafka_bootstrap, tmp_path, make_topic
):
    records = _records()
    fold = OrderStateProjection()
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    spec = unregistered_spec("order_state")

    def writer(generation: int) -> FoldWriter:
        return FoldWriter(dataclasses.replace(target, generation=generation), fold)

    # g1, live: folds 40% of the log, is snapshotted, folds on to 50%.
    assert registry.create({"topics": [TOPIC]}, live=True) == 1
    writer(1).apply(_upto(records, 0.4), batch_id=0)
    snapshot = SnapshotStore(registry).take(1)
    writer(1).apply(_upto(records, 0.5), batch_id=1)

    # g2, a replay from an offset (40%), seeded from the snapshot: folds to 60%, goes live.
    from_offset = registry.create({"topics": [TOPIC], "replay_of": 1})
    SnapshotStore(registry).seed(snapshot, from_offset)
    writer(from_offset).apply(_upto(records, 0.6), batch_id=0)
    registry.flip(from_offset)

    # g3, a full replay killed at 70% (ahead of the live g2): gc collects it, and the retired
    # g1 with it (their indexes go too).
    killed = registry.create({"topics": [TOPIC], "replay_of": from_offset})
    writer(killed).apply(_upto(records, 0.7), batch_id=0)
    collected = collect_garbage(spec, client, target.key_prefix, str(tmp_path), execute=True)
    assert {g for g, _keys in collected} == {1, killed}

    # The live g2 folds on to 75%, over what the killed replay sent.
    writer(from_offset).apply(_upto(records, 0.75), batch_id=1)

    # A full replay: folds to 90%, goes live; a rollback to g2, which then folds it all.
    full = registry.create({"topics": [TOPIC], "replay_of": from_offset})
    writer(full).apply(_upto(records, 0.9), batch_id=0)
    registry.flip(full)
    assert rollback(spec, client, target.key_prefix) == (from_offset, full)
    writer(from_offset).apply(records, batch_id=2)

    letters = dlq_letters(kafka_bootstrap, target.dlq_topic)
    sent = Counter((p, o, reason) for p, o, reason, _g in letters)
    twice = {letter: n for letter, n in sent.items() if n > 1}
    assert not twice, f"{len(twice)} letters sent more than once, e.g. {sorted(twice)[:5]}"
    # Every bad record is there: a plain fold of the whole log in one generation decides the
    # same letters.
    reference = dataclasses.replace(
        target, key_prefix=f"{target.key_prefix}-ref", dlq_topic=make_topic(1, "dlq-ref")
    )
    GenerationRegistry.of(client, "order_state", reference.key_prefix).create({}, live=True)
    FoldWriter(reference, fold).apply(records, batch_id=0)
    expected = {(p, o, r) for p, o, r, _g in dlq_letters(kafka_bootstrap, reference.dlq_topic)}
    assert set(sent) == expected
    assert {r for *_po, r in expected} >= {"bad-magic", "rejected"}  # the premise
    # Each generation sent its share: none was left out by the others' suppression.
    assert {g for *_por, g in letters} == {1, from_offset, killed, full}
