"""A pattern processor on real Spark through kill -9s: order_alerts equals its oracle.

order_alerts (an absence and a sequence per order on commerce.orders) runs as a processor
process, killed twice while records are still to fold and deadlines armed; its states and
aggregate equal the plain-Python oracle (``fold_timed``), and the insights on its insights topic
are exactly the oracle's (at least once: a kill may repeat some, never change one). Absence
deadlines armed before a kill are timers in Redis, and fire after the restart.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from refold.contracts.codec import MAGIC, EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.patterns import PatternOptions
from refold.processors.order_alerts.config import ORDER_ALERTS
from refold.processors.order_alerts.projection import build
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.topics import read_to_end
from tests.support.waiting import assert_eventually
from tests.support.windows import timed_input

NAME = "order_alerts"
CODEC = EventCodec()


def _insights(bootstrap: str, topic: str) -> dict[str, dict]:
    """The insights on ``topic`` by id (a repeated one must be identical)."""
    seen: dict[str, dict] = {}
    for message in read_to_end(bootstrap, topic):
        value = message.value()
        assert value.startswith(MAGIC)  # Avro, written with the Insight contract
        insight = CODEC.decode(value).data
        assert seen.setdefault(insight["insight_id"], insight) == insight
    return seen


def test_order_alerts_equal_their_oracle_through_kills(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    insights = make_topic(partitions=4, prefix="insights")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")
    options = PatternOptions(
        topics=[orders],
        dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
        insights_topic=insights,
        max_offsets_per_trigger=1_500,
    )
    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, {NAME: options})
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    # 2,000 carts open at once: a cart's next event comes ~400 s later (event time), so many
    # payments wait more than 10 minutes for their shipping, and deadlines are armed at a kill.
    events = list(OrderSimulator(2_500, seed=21, concurrency=2_000))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, NAME, redis_settings.key_prefix)
    reader = StateReader(client, NAME, redis_settings.key_prefix)

    def applied() -> int:
        live = registry.live()
        return 0 if live is None else sum(registry.positions(live)[0].values())

    def armed() -> set[str]:
        """The orders with an absence deadline armed (their timer is in Redis)."""
        return {
            key for key, state in reader.scan("patterns") if state["open"].get("paid_not_shipped")
        }

    third = len(events) // 3
    processes: list[GroupProcess] = []

    def start(run: int) -> GroupProcess:
        log = tmp_path / f"run-{run}.log"
        process = GroupProcess(launcher.argv([NAME]), launcher.env(), log).start()
        processes.append(process)
        return process

    try:
        publisher.emit_many(events[:third])
        process = start(1)
        assert_eventually(
            lambda: applied() > third // 3,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[third : 2 * third])
        process.kill()  # kill -9 with records still to fold and deadlines armed
        before_kill = armed()
        assert before_kill, "deadlines were armed when the processor died"
        process = start(2)
        assert_eventually(
            lambda: applied() > third + third // 2,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[2 * third :])
        process.kill()
        process = start(3)

        oracle = fold_timed(
            build(options), ORDER_ALERTS.event_time, (orders,), timed_input(kafka_bootstrap, orders)
        )
        assert_eventually(
            lambda: dict(reader.scan("patterns")) == oracle.states,
            timeout=300,
            alive=process.alive,
            message=process.log_tail,
        )
        assert reader.aggregate("insight_counts").value == dict(oracle.aggregate)
        want = {e.value["insight_id"]: e.value for e in oracle.effects}
        assert {i["pattern"] for i in want.values()} == {"paid_not_shipped", "paid_then_cancelled"}
        assert_eventually(
            lambda: _insights(kafka_bootstrap, insights) == want,
            timeout=60,
            alive=process.alive,
            message=process.log_tail,
        )
        # Deadlines armed before the first kill fired after a restart, from their Redis timers.
        fired = {
            i["key"] for i in want.values() if i["pattern"] == "paid_not_shipped"
        } & before_kill
        assert fired, "an absence armed before a kill fired after it"
        assert oracle.late == []
    finally:
        for running in processes:
            running.stop()
        publisher.close()
