from collections import Counter, defaultdict

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES, WEB
from refold.deploy.simulators.clickstream import SESSION_TIMEOUT_MS, ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator, first_orders

WEB_TYPES = set(PAGEVIEWS.event_types) | set(SEARCHES.event_types)
CRM_TYPES = set(CUSTOMERS.event_types)


@pytest.fixture(scope="module")
def events():
    return list(ClickstreamSimulator(2000, seed=11))


def _late(events):
    """Indexes of events whose occurred_at is older than an earlier event of their session."""
    newest: dict[str, int] = {}
    late = set()
    for index, (event_type, event) in enumerate(events):
        if event_type not in WEB_TYPES:
            continue
        key = event["session_id"]
        if event["occurred_at"] < newest.get(key, 0):
            late.add(index)
        newest[key] = max(newest.get(key, 0), event["occurred_at"])
    return late


def test_same_arguments_same_stream():
    simulator = ClickstreamSimulator(300, seed=5)
    assert list(simulator) == list(simulator) == list(ClickstreamSimulator(300, seed=5))
    assert list(ClickstreamSimulator(300, seed=5)) != list(ClickstreamSimulator(300, seed=6))


def test_every_event_encodes_and_belongs_to_a_web_topic(events):
    codec = EventCodec()
    topic_of = {t: spec for spec in WEB.topics for t in spec.event_types}
    for event_type, event in events:
        codec.encode(event_type, event)
        spec = topic_of[event_type]
        assert isinstance(event[spec.key_field], str)
        assert event[spec.key_field]
    kinds = Counter(t for t, _ in events)
    assert set(kinds) == set(topic_of)
    assert kinds["PageViewed"] > kinds["SearchPerformed"] > kinds["SearchResultClicked"]
    assert kinds["CustomerRegistered"] > kinds["ProfileChanged"] > 0


def test_the_clickstream_topics_are_co_partitioned_by_session():
    assert PAGEVIEWS.key_field == SEARCHES.key_field == "session_id"
    assert PAGEVIEWS.partitions == SEARCHES.partitions
    assert CUSTOMERS.key_field == "customer_id"


def test_a_session_is_one_visitor_and_one_customer(events):
    sessions = defaultdict(set)
    for event_type, event in events:
        if event_type in WEB_TYPES:
            sessions[event["session_id"]].add((event["visitor_id"], event["customer_id"]))
    assert len(sessions) == 2000
    assert all(len(who) == 1 for who in sessions.values())
    anonymous = sum(1 for who in sessions.values() if next(iter(who))[1] is None)
    assert 0.5 < anonymous / len(sessions) < 0.8
    visitors = {next(iter(who))[0] for who in sessions.values()}
    assert len(visitors) < len(sessions)  # some visitors come back


def test_clicks_refer_to_earlier_searches_of_the_same_session(events):
    late = _late(events)
    searches = {}  # search_id -> (index, event)
    for index, (event_type, event) in enumerate(events):
        if event_type == "SearchPerformed":
            searches[event["search_id"]] = (index, event)
    clicks = [(i, e) for i, (t, e) in enumerate(events) if t == "SearchResultClicked"]
    assert clicks
    for index, click in clicks:
        search_index, search = searches[click["search_id"]]
        assert search["session_id"] == click["session_id"]
        assert search["occurred_at"] < click["occurred_at"]
        assert 1 <= click["position"] <= min(search["results_count"], 48)
        # in the stream too, unless the search was delivered late
        assert search_index < index or search_index in late


def test_clicks_favour_the_top_results(events):
    positions = Counter(e["position"] for t, e in events if t == "SearchResultClicked")
    assert positions[1] > positions[2] > positions[5] > positions[20]


def test_customers_register_before_their_sessions_and_change_in_order(events):
    registered = {}
    last_change = {}
    for event_type, event in events:
        if event_type == "CustomerRegistered":
            assert event["customer_id"] not in registered
            registered[event["customer_id"]] = event["registered_at"]
            last_change[event["customer_id"]] = event["registered_at"]
        elif event_type == "ProfileChanged":
            assert event["changed_at"] > last_change[event["customer_id"]]
            last_change[event["customer_id"]] = event["changed_at"]
            changed = [k for k in ("email", "name", "country", "tier") if event[k] is not None]
            assert changed
        elif event["customer_id"] is not None:
            assert event["occurred_at"] > registered[event["customer_id"]]


def _time(event):
    return event.get("occurred_at") or event.get("registered_at") or event["changed_at"]


def _delayed(events):
    """Indexes of events older than an event yielded before them (any key)."""
    newest = 0
    delayed = set()
    for index, (_, event) in enumerate(events):
        if _time(event) < newest:
            delayed.add(index)
        newest = max(newest, _time(event))
    return delayed


def test_time_is_ordered_except_a_few_late_events_and_long_pauses_exist(events):
    late, delayed = _late(events), _delayed(events)
    assert 0 < len(late) <= len(delayed) < 0.02 * len(events)
    assert late <= delayed
    assert all(events[i][0] in WEB_TYPES for i in delayed)  # account events are never late
    times = defaultdict(list)
    for event_type, event in events:
        if event_type in WEB_TYPES:
            times[event["session_id"]].append(event["occurred_at"])
    pauses = sum(
        1
        for ts in times.values()
        for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)
        if b - a > SESSION_TIMEOUT_MS
    )
    assert pauses > 0


def test_without_late_events_the_stream_is_in_event_time_order():
    events = list(ClickstreamSimulator(300, seed=3, late_rate=0.0))
    assert not _delayed(events)


def test_customers_can_be_the_order_simulators():
    orders = OrderSimulator(900, seed=2)
    shared = set(orders.customer_ids)
    ordering = {e["customer_id"] for t, e in orders if t == "OrderPlaced"}
    assert ordering <= shared
    clicks = ClickstreamSimulator(1000, seed=2, customer_ids=orders.customer_ids)
    web_customers = {e["customer_id"] for _, e in clicks if e.get("customer_id")}
    assert web_customers <= shared
    assert len(web_customers & ordering) > 50


def test_every_ordering_customer_is_registered_before_its_first_order():
    orders = OrderSimulator(900, seed=2)
    first = first_orders(orders)
    alone = ClickstreamSimulator(300, seed=2, customer_ids=orders.customer_ids)
    alone_registered = {e["customer_id"] for t, e in alone if t == "CustomerRegistered"}
    assert len(alone_registered) < len(first)  # sessions alone register only some
    events = list(
        ClickstreamSimulator(300, seed=2, customer_ids=orders.customer_ids, registered_by=first)
    )
    registered = {}
    for t, e in events:
        if t == "CustomerRegistered":
            assert e["customer_id"] not in registered  # once
            registered[e["customer_id"]] = e["registered_at"]
    assert set(first) <= set(registered)
    assert all(registered[c] < at for c, at in first.items())
    # The account events stay in event-time order, per customer and over the topic.
    times = [e.get("registered_at") or e["changed_at"] for t, e in events if t in CRM_TYPES]
    assert times == sorted(times)


def test_no_customers_means_anonymous_sessions_only():
    events = list(ClickstreamSimulator(200, seed=4, customer_ids=()))
    assert all(e.get("customer_id") is None for _, e in events)
    assert not [t for t, _ in events if t in CUSTOMERS.event_types]
