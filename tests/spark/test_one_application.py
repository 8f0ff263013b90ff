"""Several processors as queries of ONE Spark application (one JVM): each equals its oracle,
and a query that fails stops alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import redis

from refold.contracts.commerce import ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import RESET_PENDING_FIELD, GenerationRegistry
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_stats.projection import CustomerStatsProjection
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.rekey import KeyResolver
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.session_stats.projection import SessionStatsProjection
from refold.services.errors import NoLiveGenerationError
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually

_WEB = ("PageViewed", "SearchPerformed", "SearchResultClicked")
_CRM = ("CustomerRegistered", "ProfileChanged")


@dataclasses.dataclass
class Shop:
    """Private topics for orders, profiles and clickstream, and a launcher for all three."""

    topics: dict[str, str]
    launcher: ProcessLauncher
    publisher: EventPublisher
    client: redis.Redis
    prefix: str

    def reader(self, processor: str) -> StateReader:
        return StateReader(self.client, processor, self.prefix)

    def table(self, processor: str, table: str) -> dict:
        """The live state of a table; empty until the processor has created its generation."""
        try:
            return dict(self.reader(processor).scan(table))
        except NoLiveGenerationError:
            return {}

    def start(self, names: list[str], log: Path) -> GroupProcess:
        return GroupProcess(self.launcher.argv(names), self.launcher.env(), log).start()


def _shop(kafka_bootstrap, redis_url, make_topic, unique, tmp_path) -> Shop:
    topics = {
        "orders": make_topic(partitions=ORDERS.partitions, prefix="orders"),
        "crm": make_topic(partitions=CUSTOMERS.partitions, prefix="crm"),
        "pageviews": make_topic(partitions=PAGEVIEWS.partitions, prefix="pageviews"),
        "searches": make_topic(partitions=SEARCHES.partitions, prefix="searches"),
    }
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    small = {"max_offsets_per_trigger": 3_000}
    options = {
        "order_state": OrderStateOptions(
            topics=[topics["orders"]],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            notifications_topic=f"{topics['orders']}.notifications",
            **small,
        ),
        "customer_stats": ProcessorOptions(
            topics=[topics["orders"], topics["crm"]],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            **small,
        ),
        "session_stats": ProcessorOptions(
            topics=[topics["pageviews"], topics["searches"]],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            **small,
        ),
    }
    launcher = ProcessLauncher(
        kafka, RedisSettings(url=redis_url, key_prefix=prefix), SparkSettings(), tmp_path, options
    )
    publisher = EventPublisher(
        kafka,
        topics=[
            dataclasses.replace(ORDERS, name=topics["orders"]),
            dataclasses.replace(CUSTOMERS, name=topics["crm"]),
            dataclasses.replace(PAGEVIEWS, name=topics["pageviews"]),
            dataclasses.replace(SEARCHES, name=topics["searches"]),
        ],
    )
    return Shop(topics, launcher, publisher, redis_client(redis_url), prefix)


def _traffic(orders: int, sessions: int, seed: int):
    simulator = OrderSimulator(orders, seed=seed)
    order_events = list(simulator)
    web = list(ClickstreamSimulator(sessions, seed=seed, customer_ids=simulator.customer_ids))
    return order_events, web


def test_three_processors_in_one_application_equal_their_oracles(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path
):
    shop = _shop(kafka_bootstrap, redis_url, make_topic, unique, tmp_path)
    order_events, web = _traffic(600, 500, seed=41)
    shop.publisher.emit_many(order_events)
    shop.publisher.emit_many(web)
    process = shop.start(["order_state", "customer_stats", "session_stats"], tmp_path / "app.log")
    try:
        orders = fold_all(OrderStateProjection(), order_events)
        customers = fold_all(
            CustomerStatsProjection(),
            order_events + [e for e in web if e[0] in _CRM],
            KeyResolver("customer_id", ("order_id",)),
        )
        sessions = fold_all(SessionStatsProjection(), [e for e in web if e[0] in _WEB])
        for processor, table, expected in (
            ("order_state", "orders", orders),
            ("customer_stats", "customers", customers),
            ("session_stats", "sessions", sessions),
        ):
            assert_eventually(
                lambda p=processor, t=table, e=expected: shop.table(p, t) == e.states,
                timeout=240,
                alive=process.alive,
                message=process.log_tail,
            )
        totals = shop.reader("session_stats").aggregate("session_totals").value
        assert totals == dict(sessions.aggregate)
        assert totals["clicks"] > 0
        assert totals["page_views"] > 0
        log = (tmp_path / "app.log").read_text()
        assert "session_stats: co-partitioned by session_id" in log
        assert "customer_stats: re-keyed into" in log
    finally:
        process.stop()
        shop.publisher.close()


def test_a_failing_processor_stops_alone(kafka_bootstrap, redis_url, make_topic, unique, tmp_path):
    shop = _shop(kafka_bootstrap, redis_url, make_topic, unique, tmp_path)
    # session_stats' live generation is half reset: its query must refuse to start...
    registry = GenerationRegistry.of(shop.client, "session_stats", shop.prefix)
    broken = registry.create({"topics": []}, live=True)
    registry.update_meta(broken, {RESET_PENDING_FIELD: "to-earliest"})
    order_events, _web = _traffic(200, 10, seed=42)
    shop.publisher.emit_many(order_events)
    process = shop.start(["session_stats", "order_state"], tmp_path / "app.log")
    try:
        # ... while order_state, in the same application, folds everything.
        expected = fold_all(OrderStateProjection(), order_events)
        assert_eventually(
            lambda: shop.table("order_state", "orders") == expected.states,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        log = (tmp_path / "app.log").read_text()
        assert "session_stats failed; the other processors go on" in log
        assert "half reset" in log
        assert process.alive()
    finally:
        process.stop()
        shop.publisher.close()
