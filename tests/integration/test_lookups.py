"""A stream-table join (enriched_clicks reading customer_profiles' versioned table) through the
envelope and the driver's joiner, against real Redis and a real broker.

Each click is joined once the table's watermark has passed it, with the profile version valid
at its time: the same counts whether the table was complete or still catching up when the
joiner ran, whatever the chunks, and a repeated round changes nothing.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from refold.contracts.codec import EventCodec
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.windows import watermark_of
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import customer_id
from refold.processors.customer_profiles.config import CUSTOMER_PROFILES
from refold.processors.customer_profiles.projection import CustomerProfilesProjection
from refold.processors.enriched_clicks.config import ENRICHED_CLICKS
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.oracle import fold_lookups, fold_timed
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldWriter
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.services.reader.state_reader import StateReader

CODEC = EventCodec()
PARTITIONS = 4
CRM = ("CustomerRegistered", "ProfileChanged")


def _logs(events, types, key):
    logs: dict[int, list[SourceRecord]] = {}
    topic = "crm" if types == CRM else "se"
    for event_type, event in events:
        if event_type not in types:
            continue
        partition = zlib.crc32(event[key].encode()) % PARTITIONS
        log = logs.setdefault(partition, [])
        log.append(
            SourceRecord(
                topic, partition, len(log), event[key].encode(), CODEC.encode(event_type, event)
            )
        )
    return [r for p in sorted(logs) for r in logs[p]]


def _decoded(records):
    for r in records:
        event = CODEC.decode(r.value)
        yield r.topic, r.partition, r.offset, event.event_type, event.data


def _chunks(records, rng):
    i = 0
    while i < len(records):
        size = rng.randint(1, 200)
        yield records[i : i + size]
        i += size


def test_clicks_join_the_profile_valid_at_their_time_whatever_the_table_s_progress(
    target, redis_url
):
    customers = tuple(customer_id(n) for n in range(1, 80))
    events = list(
        ClickstreamSimulator(
            500, seed=13, customer_ids=customers, customer_share=0.6, late_rate=0.02
        )
    )
    crm = _logs(events, CRM, "customer_id")
    clicks = _logs(events, ("SearchResultClicked",), "session_id")
    client = redis_client(redis_url)
    prefix = target.key_prefix
    table = dataclasses.replace(
        target,
        processor="customer_profiles",
        event_time=CUSTOMER_PROFILES.event_time,
        topics=("crm",),
    )
    tables = GenerationRegistry.of(client, "customer_profiles", prefix)
    starts = {position_field("crm", p): 0 for p in range(PARTITIONS)}  # as a processor starts
    tables.set_positions(tables.create({"topics": ["crm"]}, live=True), starts)
    table_writer = FoldWriter(table, CustomerProfilesProjection())
    profiles = fold_timed(
        CustomerProfilesProjection(), CUSTOMER_PROFILES.event_time, ("crm",), _decoded(crm)
    )
    lateness = CUSTOMER_PROFILES.event_time.lateness_ms

    results = []
    for generation, table_first in ((1, True), (2, False)):
        layout = StateLayout("enriched_clicks", prefix)
        GenerationRegistry(client, layout).create({"topics": ["se"]}, live=generation == 1)
        joined = dataclasses.replace(
            target,
            processor="enriched_clicks",
            generation=generation,
            event_time=ENRICHED_CLICKS.event_time,
            topics=("se",),
        )
        writer = FoldWriter(joined, EnrichedClicksProjection())
        joiner = LookupJoiner(
            layout,
            generation,
            EnrichedClicksProjection(),
            ENRICHED_CLICKS.event_time,
            lateness,
            redis_url,
            {"bootstrap.servers": "unused:1"},
            target.dlq_topic,
        )
        if table_first:
            table_writer.apply(crm)
            for chunk in _chunks(clicks, random.Random(1)):
                writer.apply(chunk)
            joiner.run()
        else:  # a rebuild of the clicks while the table is rebuilt too, step by step
            table_gen = dataclasses.replace(table, generation=2)
            tables.set_positions(tables.create({"topics": ["crm"]}), starts)
            client.set(StateLayout("customer_profiles", prefix).alias, 2)
            rebuilding = FoldWriter(table_gen, CustomerProfilesProjection())
            table_chunks = list(_chunks(crm, random.Random(2)))
            click_chunks = list(_chunks(clicks, random.Random(3)))
            for i in range(max(len(table_chunks), len(click_chunks))):
                if i < len(click_chunks):
                    writer.apply(click_chunks[i])
                joiner.run()  # joins what the table's watermark has passed so far
                if i < len(table_chunks):
                    rebuilding.apply(table_chunks[i])
            joiner.run()
        assert joiner.run() == 0  # a repeated round joins nothing more
        reader = StateReader(client, "enriched_clicks", prefix)
        totals = reader.aggregate("clicks_by_customer", generation).value
        waiting = client.zcard(layout.generation(generation).timers("lookup"))
        results.append((totals, waiting))

    clocks = {position_field("crm", p): t for (_t, p), t in _clocks(crm).items()}
    expected = fold_lookups(
        EnrichedClicksProjection(),
        ENRICHED_CLICKS.event_time,
        _decoded(clicks),
        profiles.states,
        watermark_of(clocks, lateness),
    )
    assert results[0] == (dict(expected.aggregate), expected.waiting)
    assert results[1] == results[0]
    totals = results[0][0]
    assert totals["clicks"] > 50
    assert totals.get("anonymous", 0) > 0
    assert any(k.startswith("tier:") for k in totals)
    # Versions mattered: some customer changed tier or country over time.
    assert any(
        len({(v[1]["tier"], v[1]["country"]) for v in s["versions"]}) > 1
        for s in profiles.states.values()
    )


def _clocks(records):
    clocks: dict[tuple[str, int], int] = {}
    for _topic, partition, _offset, event_type, event in _decoded(records):
        field = CUSTOMER_PROFILES.event_time.field_of(event_type)
        clocks[("crm", partition)] = max(clocks.get(("crm", partition), 0), event[field])
    return clocks
