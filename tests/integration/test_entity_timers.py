"""Entity folds with event time and timers through the envelope, against real Redis and a broker.

Session windows (web_sessions, two co-partitioned topics) and a windowed stream-stream join
(search_ctr) equal their plain-Python oracle whatever the chunking and however the topics
interleave: timers fire on each partition group's watermark, record by record in log order.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from itertools import chain

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.search_ctr.config import SEARCH_CTR
from refold.processors.search_ctr.projection import SearchCtrProjection, ctr
from refold.processors.web_sessions.config import WEB_SESSIONS
from refold.processors.web_sessions.projection import WebSessionsProjection
from refold.services.reader.state_reader import StateReader
from tests.support.topics import interleaved

CODEC = EventCodec()
TOPICS = {"PageViewed": "pv", "SearchPerformed": "se", "SearchResultClicked": "se"}
PARTITIONS = 4


def _log(events):
    """The events as two topics' logs: (topic, partition) -> records in log order; their
    decoded events; and every record in publishing order."""
    logs: dict[tuple[str, int], list[SourceRecord]] = {}
    decoded = {}
    published = []
    for event_type, event in events:
        topic = TOPICS.get(event_type)
        if topic is None:
            continue
        partition = zlib.crc32(event["session_id"].encode()) % PARTITIONS
        log = logs.setdefault((topic, partition), [])
        record = SourceRecord(
            topic,
            partition,
            len(log),
            event["session_id"].encode(),
            CODEC.encode(event_type, event),
        )
        log.append(record)
        published.append(record)
        decoded[(topic, partition, record.offset)] = (event_type, CODEC.decode(record.value).data)
    return logs, decoded, published


def _oracle_input(records, decoded):
    for r in records:
        event_type, data = decoded[(r.topic, r.partition, r.offset)]
        yield r.topic, r.partition, r.offset, event_type, data


def _run(target, projection, records, rng=None):
    writer = FoldWriter(target, projection)
    if rng is None:
        writer.apply(records, batch_id=0)
        return
    i = 0
    batch = 0
    while i < len(records):
        size = rng.randint(1, 300)
        writer.apply(records[i : i + size], batch_id=batch)
        i, batch = i + size, batch + 1
    writer.apply(records, batch_id=batch)  # a replayed batch changes nothing


def _target(base: FoldTarget, name: str, spec, topics, generation: int) -> FoldTarget:
    return dataclasses.replace(
        base,
        processor=name,
        generation=generation,
        event_time=spec.event_time,
        topics=topics,
        check_keys=True,
    )


def test_session_windows_equal_the_oracle_whatever_the_chunks(target, redis_url, make_topic):
    events = list(ClickstreamSimulator(250, seed=3, late_rate=0.05, long_gap_rate=0.3))
    logs, decoded, published = _log(events)
    closed = make_topic(partitions=4, prefix="closed")
    projection = WebSessionsProjection(closed_topic=closed)
    client = redis_client(redis_url)
    reader = StateReader(client, "web_sessions", target.key_prefix)
    # The oracle in publishing order; the writers see the topics interleaved at random, and
    # (generation 4) one whole topic before the other, as a first micro-batch may.
    oracle = fold_timed(
        projection, WEB_SESSIONS.event_time, ("pv", "se"), _oracle_input(published, decoded)
    )
    topic_by_topic = [r for _tp, log in sorted(logs.items()) for r in log]
    tables = []
    for generation, seed in ((1, None), (2, 5), (3, 6), (4, None)):
        rng = None if seed is None else random.Random(seed)
        records = (
            topic_by_topic
            if generation == 4
            else interleaved(chain.from_iterable(logs.values()), random.Random(seed or 0))
        )
        chosen = _target(target, "web_sessions", WEB_SESSIONS, ("pv", "se"), generation)
        _run(chosen, projection, records, rng)
        tables.append(
            (
                dict(reader.scan("visits", generation)),
                reader.aggregate("visit_totals", generation).value,
            )
        )
        assert tables[-1] == (oracle.states, dict(oracle.aggregate)), generation
    states, totals = tables[0]
    assert totals["closed"] > 0
    assert totals["visits"] > len(states)  # some sessions were split by the gap
    assert oracle.late  # late events were judged (and dead-lettered)


def test_search_click_join_equals_the_oracle_with_out_of_order_sides(target, redis_url, make_topic):
    events = list(ClickstreamSimulator(400, seed=9, late_rate=0.08))
    logs, decoded, _published = _log(e for e in events if e[0] != "PageViewed")
    projection = SearchCtrProjection()
    client = redis_client(redis_url)
    reader = StateReader(client, "search_ctr", target.key_prefix)
    results = []
    for generation, seed in ((1, None), (2, 11)):
        rng = None if seed is None else random.Random(seed)
        records = interleaved(chain.from_iterable(logs.values()), random.Random(seed or 0))
        chosen = _target(target, "search_ctr", SEARCH_CTR, ("se",), generation)
        _run(chosen, projection, records, rng)
        totals = reader.aggregate("ctr", generation).value
        results.append((dict(reader.scan("search_buffers", generation)), totals))
        oracle = fold_timed(
            projection, SEARCH_CTR.event_time, ("se",), _oracle_input(records, decoded)
        )
        assert results[-1] == (oracle.states, dict(oracle.aggregate))
    assert results[0] == results[1]
    rates = ctr(results[0][1])
    assert sum(s for s, _c, _r in rates.values()) > 100
    assert 0 < sum(c for _s, c, _r in rates.values()) < sum(s for s, _c, _r in rates.values())
    # Out of order for real: some clicks came before their search in the log.
    orders = {}
    for (_topic, partition, offset), (event_type, data) in decoded.items():
        orders.setdefault(data["search_id"], []).append((offset, partition, event_type))
    assert any(
        sorted(seen)[0][2] == "SearchResultClicked" for seen in orders.values() if len(seen) > 1
    )


def test_an_entity_s_timer_waits_for_every_topic_of_its_partition_group(
    target, redis_url, make_topic
):
    """A visit closes only when both topics' clocks at its partition id are past its gap."""
    closed = make_topic(partitions=4, prefix="closed")
    projection = WebSessionsProjection(closed_topic=closed, gap_ms=60_000)
    chosen = _target(target, "web_sessions", WEB_SESSIONS, ("pv", "se"), 1)
    base = 1_700_000_000_000

    def view(offset: int, at: int, session: str = "s1") -> SourceRecord:
        event = {
            "event_id": f"v{offset}",
            "session_id": session,
            "visitor_id": "v",
            "url": "https://shop/x",
            "path": "/x",
            "page_type": "HOME",
            "device": "DESKTOP",
            "occurred_at": at,
        }
        return SourceRecord("pv", 0, offset, session.encode(), CODEC.encode("PageViewed", event))

    def search(offset: int, at: int, session: str = "s2") -> SourceRecord:
        event = {
            "event_id": f"s{offset}",
            "session_id": session,
            "visitor_id": "v",
            "search_id": f"q{offset}",
            "query": "shoes",
            "results_count": 3,
            "occurred_at": at,
        }
        return SourceRecord(
            "se", 0, offset, session.encode(), CODEC.encode("SearchPerformed", event)
        )

    writer = FoldWriter(chosen, projection)
    writer.apply([view(0, base), search(0, base)])
    # pv's clock passes the gap + lateness, se's does not: the visit stays open.
    later = base + 60_000 + WEB_SESSIONS.event_time.lateness_ms + 1
    writer.apply([view(1, later, "s3")])
    reader = StateReader(redis_client(redis_url), "web_sessions", target.key_prefix)
    assert reader.get("visits", "s1", 1).value["closed"] == 0
    writer.apply([search(1, later, "s4")])  # now both clocks are past it
    state = reader.get("visits", "s1", 1).value
    assert (state["closed"], state["open"]) == (1, [])


def test_join_sides_out_of_order_within_the_lateness_and_beyond_it(target, redis_url):
    """A click before its search (within the lateness) matches; a click beyond it is late."""
    chosen = _target(target, "search_ctr", SEARCH_CTR, ("se",), 1)
    base, minute = 1_700_000_000_000, 60_000
    lateness = SEARCH_CTR.event_time.lateness_ms

    def event(offset: int, event_type: str, search: str, at: int, session: str) -> SourceRecord:
        fields = {
            "event_id": f"e{offset}",
            "session_id": session,
            "visitor_id": "v",
            "search_id": search,
            "occurred_at": at,
        }
        if event_type == "SearchPerformed":
            fields |= {"query": f"term-{search}", "results_count": 5}
        else:
            fields |= {"position": 1, "sku": "SKU-1", "url": "https://shop/p/1"}
        value = CODEC.encode(event_type, fields)
        return SourceRecord("se", 0, offset, session.encode(), value)

    records = [
        event(0, "SearchPerformed", "s1", base, "a"),
        event(1, "SearchResultClicked", "s2", base + 2 * minute, "b"),  # before its search
        event(2, "SearchPerformed", "s2", base + minute, "b"),  # 1 min behind: on time
        event(3, "SearchPerformed", "s9", base + 10 * minute, "c"),  # the clock moves on
        event(4, "SearchResultClicked", "s1", base + minute, "a"),  # 9 min behind: late
        event(5, "SearchPerformed", "s10", base + 30 * minute + lateness, "c"),  # settles all
    ]
    writer = FoldWriter(chosen, SearchCtrProjection())
    outcomes = [writer.apply([r], batch_id=i) for i, r in enumerate(records)]
    assert [o.late for o in outcomes] == [0, 0, 0, 0, 1, 0]
    reader = StateReader(redis_client(redis_url), "search_ctr", target.key_prefix)
    totals = reader.aggregate("ctr", 1).value
    assert ctr(totals)["term-s1"] == (1, 0, 0.0)  # its only click came beyond the lateness
    assert ctr(totals)["term-s2"] == (1, 1, 1.0)  # its click came first, within it
    oracle = fold_timed(
        SearchCtrProjection(),
        SEARCH_CTR.event_time,
        ("se",),
        ((r.topic, r.partition, r.offset, *_decode(r)) for r in records),
    )
    assert totals == dict(oracle.aggregate)
    assert oracle.late == [("se/0", 4)]


def _decode(record: SourceRecord) -> tuple[str, dict]:
    decoded = CODEC.decode(record.value)
    return decoded.event_type, decoded.data
