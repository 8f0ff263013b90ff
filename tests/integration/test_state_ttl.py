"""State that expires through the envelope, against real Redis: live == oracle, any chunking."""

from __future__ import annotations

import dataclasses
import random
import zlib

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.services.reader.state_reader import StateReader
from tests.support.expiring import EVENT_TIME, NAME, TTL, ExpiringPages
from tests.support.topics import interleaved

CODEC = EventCodec()
PARTITIONS = 4


def _log(events):
    logs: dict[int, list[SourceRecord]] = {}
    oracle_input = []
    for event_type, event in events:
        if event_type != "PageViewed":
            continue
        partition = zlib.crc32(event["session_id"].encode()) % PARTITIONS
        log = logs.setdefault(partition, [])
        value = CODEC.encode(event_type, event)
        record = SourceRecord("pv", partition, len(log), event["session_id"].encode(), value)
        log.append(record)
        data = CODEC.decode(value).data
        oracle_input.append(("pv", partition, record.offset, event_type, data))
    return logs, oracle_input


def test_expired_sessions_leave_table_and_aggregate_as_the_oracle_says_whatever_the_chunks(
    target: FoldTarget, redis_url
):
    events = list(ClickstreamSimulator(300, seed=11, late_rate=0.03, long_gap_rate=0.4))
    logs, oracle_input = _log(events)
    oracle = fold_timed(ExpiringPages(), EVENT_TIME, ("pv",), oracle_input, state_ttl=TTL)
    assert oracle.expired > 20, oracle.expired  # sessions do expire
    client = redis_client(redis_url)
    reader = StateReader(client, NAME, target.key_prefix)
    for generation, seed in ((1, None), (2, 5), (3, 6)):
        chosen = dataclasses.replace(
            target,
            processor=NAME,
            generation=generation,
            event_time=EVENT_TIME,
            state_ttl=TTL,
            topics=("pv",),
        )
        writer = FoldWriter(chosen, ExpiringPages())
        records = [r for _p, log in sorted(logs.items()) for r in log]
        if seed is None:
            writer.apply(records, batch_id=0)
        else:
            rng = random.Random(seed)
            mixed = list(interleaved([r for log in logs.values() for r in log], rng))
            i = batch = 0
            while i < len(mixed):
                size = rng.randint(1, 200)
                writer.apply(mixed[i : i + size], batch_id=batch)
                i, batch = i + size, batch + 1
            writer.apply(mixed, batch_id=batch)  # a replayed batch changes nothing
        assert dict(reader.scan("sessions", generation)) == oracle.states, generation
        assert reader.aggregate("page_totals", generation).value == dict(oracle.aggregate)
        stats = ProcessorStats(client, chosen.layout).read(generation)
        assert stats.expired == oracle.expired, generation
