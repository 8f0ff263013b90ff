"""Results out on real Spark: a chained processor through a kill -9, webhooks through a replay.

1. order_state publishes its status changes (Avro, keyed by customer_id) and customer_orders
   folds them, as two queries of one application killed with kill -9 mid-stream: every change
   counts exactly once downstream (== a plain fold of the orders), and a read_committed reader
   of the changes sees each once.
2. order_alerts' insights go to a local webhook receiver that fails at times: every critical
   insight of the oracle is delivered; while ``replay`` rebuilds order_alerts from the earliest
   offset (the live generation serving and caught up) nothing is sent; after the flip, new
   insights of the new generation are delivered, none lost.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from refold.contracts.commerce import ORDER_CHANGES, ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator
from refold.deploy.simulators.webhook_receiver import WebhookReceiver
from refold.processors.customer_orders.projection import CustomerOrdersProjection
from refold.processors.fold.oracle import fold_all, fold_timed
from refold.processors.fold.patterns import PatternOptions
from refold.processors.order_alerts.config import ORDER_ALERTS
from refold.processors.order_alerts.projection import build as build_alerts
from refold.processors.order_state.config import OrderStateOptions
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from refold.services.webhooks.config import WebhookSettings
from refold.services.webhooks.dispatcher import WebhookDispatcher
from tests.support.chain import senders, status_changes
from tests.support.waiting import assert_eventually
from tests.support.windows import timed_input


def _applied(registry: GenerationRegistry) -> int:
    live = registry.live()
    return 0 if live is None else sum(registry.positions(live)[0].values())


def test_a_chained_processor_counts_each_change_once_through_a_kill(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    changes = make_topic(partitions=ORDER_CHANGES.partitions, prefix="changes")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")
    options = {
        "order_state": OrderStateOptions(
            topics=[orders],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            notifications_topic=make_topic(partitions=4, prefix="notices"),
            changes_topic=changes,
            max_offsets_per_trigger=3_000,
        ),
        "customer_orders": ProcessorOptions(
            topics=[changes],
            dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
            max_offsets_per_trigger=2_000,
        ),
    }
    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options)
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    events = list(OrderSimulator(1_500, seed=8))
    client = redis_client(redis_url)
    upstream = GenerationRegistry.of(client, "order_state", redis_settings.key_prefix)
    names = ["order_state", "customer_orders"]
    processes: list[GroupProcess] = []

    def start(run: int) -> GroupProcess:
        process = GroupProcess(
            launcher.argv(names), launcher.env(), tmp_path / f"run-{run}.log"
        ).start()
        processes.append(process)
        return process

    try:
        half = len(events) // 2
        publisher.emit_many(events[:half])
        process = start(1)
        assert_eventually(
            lambda: _applied(upstream) > half // 2,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[half:])
        process.kill()  # kill -9: a batch may have produced its changes and not committed
        process = start(2)

        reader = StateReader(client, "customer_orders", redis_settings.key_prefix)
        wanted = status_changes(events)

        def counted() -> Counter[tuple[str, str]]:
            if reader.registry.live() is None:  # killed before customer_orders' first commit
                return Counter()
            return Counter(
                {
                    (customer, status): n
                    for customer, state in reader.scan("customers")
                    for status, n in state["entered"].items()
                }
            )

        assert_eventually(
            lambda: counted() == wanted, timeout=300, alive=process.alive, message=process.log_tail
        )
        # == a plain fold of the changes log with each origin id once
        first: dict[str, tuple[str, dict]] = {}
        for _t, _p, _o, event_type, event in timed_input(kafka_bootstrap, changes):
            first.setdefault(f"{event['order_id']}:{event['status']}", (event_type, event))
        assert (
            dict(reader.scan("customers"))
            == fold_all(CustomerOrdersProjection(), first.values()).states
        )
        totals = reader.aggregate("order_changes").value
        assert totals["to:placed"] == sum(1 for t, _e in events if t == "OrderPlaced")
        # The changes are written in Kafka transactions: read_committed, each is on the topic
        # once, whatever the killed batch had produced or committed.
        sent = senders(kafka_bootstrap, changes, "read_committed")
        assert len(sent) == len(set(sent)) == sum(wanted.values())
    finally:
        for running in processes:
            running.stop()
        publisher.close()


def test_webhooks_deliver_every_insight_and_send_nothing_while_replay_builds(
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
        max_offsets_per_trigger=2_000,
    )
    launcher = ProcessLauncher(
        kafka, redis_settings, SparkSettings(), tmp_path, {"order_alerts": options}
    )
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    # Many carts open at once: payments wait long for shipping, so absences fire.
    events = list(OrderSimulator(1_600, seed=5, concurrency=1_200))
    first_part, second_part = events[: len(events) * 2 // 3], events[len(events) * 2 // 3 :]
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_alerts", redis_settings.key_prefix)
    receiver = WebhookReceiver(fail_every=4).start()
    settings = WebhookSettings(
        name=f"wh-{unique}",
        url=receiver.url,
        topics=(insights,),
        severities=("critical", "warning", "info"),
        backoff_initial_s=0.05,
        backoff_max_s=0.5,
    )
    dispatcher = WebhookDispatcher(
        settings, kafka.as_librdkafka(), client, redis_settings.key_prefix
    ).start()
    process: GroupProcess | None = None

    def oracle_ids() -> set[str]:
        oracle = fold_timed(
            build_alerts(options),
            ORDER_ALERTS.event_time,
            (orders,),
            timed_input(kafka_bootstrap, orders),
        )
        return {e.value["insight_id"] for e in oracle.effects}

    def delivered() -> set[str]:
        return {body["data"]["insight_id"] for body in receiver.accepted.values()}

    try:
        publisher.emit_many(first_part)
        process = GroupProcess(
            launcher.argv(["order_alerts"]), launcher.env(), tmp_path / "live.log"
        ).start()
        want = oracle_ids()
        assert len(want) > 5
        assert_eventually(
            lambda: delivered() == want, timeout=300, alive=process.alive, message=process.log_tail
        )
        assert receiver.snapshot()["by_status"].get(503, 0) > 0  # retried, none lost

        # Replay while the live generation serves (caught up): nothing is sent again.
        before = receiver.snapshot()["requests"]
        spec = processor_spec("order_alerts")
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        rebuilt = run_rebuild(
            plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=launcher
        )
        assert rebuilt.generation == registry.live()
        assert receiver.snapshot()["requests"] == before

        # After the flip the live process folds the new generation: new insights go out.
        assert_eventually(
            lambda: f":{process.pid}:" in (registry.lease_owner(rebuilt.generation) or ""),
            timeout=120,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(second_part)
        want = oracle_ids()
        assert_eventually(
            lambda: delivered() == want, timeout=300, alive=process.alive, message=process.log_tail
        )
        assert receiver.duplicates == 0
    finally:
        if process is not None:
            process.stop()
        dispatcher.stop()
        receiver.stop()
        publisher.close()
