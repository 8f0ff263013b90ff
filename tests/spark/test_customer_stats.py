"""The re-keyed customer_stats processor (key customer_id on order_id-partitioned orders, plus
a customer-keyed profiles topic) equals its oracle through kill -9s under live traffic, and so
does its online rebuild (replay --to-earliest --execute of a plug-in processor)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from refold.contracts.commerce import ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import CUSTOMERS
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.customer_stats.projection import CustomerStatsProjection
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.rekey import KeyResolver
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.waiting import assert_eventually

NAME = "customer_stats"


def _events(orders: int, seed: int) -> list[tuple[str, dict]]:
    """Orders and the profiles of their customers, interleaved as a shop's traffic is."""
    simulator = OrderSimulator(orders, seed=seed)
    order_events = list(simulator)
    profiles = [
        (t, e)
        for t, e in ClickstreamSimulator(
            orders // 3, seed=seed, customer_ids=simulator.customer_ids
        )
        if t in ("CustomerRegistered", "ProfileChanged")
    ]
    mixed: list[tuple[str, dict]] = []
    step = max(1, len(order_events) // max(1, len(profiles)))
    for i, event in enumerate(order_events):
        mixed.append(event)
        if i % step == 0 and profiles:
            mixed.append(profiles.pop(0))
    return mixed + profiles


def _oracle(events):
    return fold_all(CustomerStatsProjection(), events, KeyResolver("customer_id", ("order_id",)))


def test_rekeyed_customer_stats_equals_the_oracle_through_three_kill_9s(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    customers = make_topic(partitions=CUSTOMERS.partitions, prefix="crm")
    dlq = make_topic(partitions=1, prefix="dlq")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")
    # Small batches: many batch boundaries, so the kills land between and inside them.
    options = ProcessorOptions(
        topics=[orders, customers], dead_letter_topic=dlq, max_offsets_per_trigger=2_000
    )
    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, {NAME: options})
    publisher = EventPublisher(
        kafka,
        topics=[
            dataclasses.replace(ORDERS, name=orders),
            dataclasses.replace(CUSTOMERS, name=customers),
        ],
    )
    events = _events(1_200, seed=31)
    # Contiguous quarters: each partition's log keeps the events' order (the oracle's input).
    quarter = len(events) // 4
    chunks = [events[i * quarter : (i + 1) * quarter] for i in range(3)] + [events[3 * quarter :]]
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, NAME, redis_settings.key_prefix)

    def applied() -> int:
        live = registry.live()
        return 0 if live is None else sum(registry.positions(live)[0].values())

    publisher.emit_many(chunks[0])
    processes: list[GroupProcess] = []
    try:
        for kill, chunk in enumerate(chunks[1:], start=1):
            process = GroupProcess(
                launcher.argv([NAME]), launcher.env(), tmp_path / "logs" / f"run-{kill}.log"
            ).start()
            processes.append(process)
            before = applied()
            publisher.emit_many(chunk)
            assert_eventually(
                lambda before=before: applied() > before,
                timeout=180,
                alive=process.alive,
                message=process.log_tail,
            )
            process.kill()  # kill -9 mid-stream, with records still to fold
        process = GroupProcess(
            launcher.argv([NAME]), launcher.env(), tmp_path / "logs" / "final.log"
        ).start()
        processes.append(process)
        expected = _oracle(events)
        reader = StateReader(client, NAME, redis_settings.key_prefix)
        assert_eventually(
            lambda: dict(reader.scan("customers")) == expected.states,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        assert reader.aggregate("customer_totals").value == dict(expected.aggregate)
        # The re-keying was real: states from several partitions of orders and of profiles.
        assert sum(1 for s in expected.states.values() if s["profile"]) > 10
        assert max(s["orders"] for s in expected.states.values()) > 1

        # replay --to-earliest --execute of the plug-in: a new generation, re-keyed the same.
        spec = processor_spec(NAME)
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        first = registry.live()
        result = run_rebuild(
            plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=launcher
        )
        assert (result.previous, reader.live_generation()) == (first, result.generation)
        assert dict(reader.scan("customers")) == expected.states
        assert registry.meta(result.generation)["slots"] == registry.meta(first)["slots"] == "2"
    finally:
        for process in processes:
            process.stop()
        publisher.close()
