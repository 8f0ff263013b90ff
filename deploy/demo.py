"""The end-to-end demo behind ``make run``: produce, process, query, replay, cut over.

Runs on a private local stack (Apache Kafka and redis-server on free loopback ports) and stops
everything it started, also on Ctrl-C or failure.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import StateLayout
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.progress import move_to, progress_bar
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import dead_letter_spec, effects_spec
from refold.deploy.demo_serving import read_your_write, start_service
from refold.deploy.demo_summary import clock, money, platform_summary, windows_summary
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator, SimulatedEvent, first_orders
from refold.deploy.simulators.webhook_receiver import WebhookReceiver
from refold.processors.fold.lookups import PENDING_TIMERS
from refold.processors.fold.patterns import default_insights_topic
from refold.processors.runtime.window_store import generation_watermark
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import RebuildProgress, plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from refold.services.webhooks.config import WebhookSettings
from refold.services.webhooks.dispatcher import WebhookDispatcher
from refold.services.webhooks.store import WebhookStore

__all__ = ["run_demo", "wait_until_caught_up"]

PROCESSOR = "order_state"  # the one the demo replays
# Run together as queries of one Spark application (one JVM).
PROCESSORS = (
    "order_state",
    "customer_stats",
    "session_stats",
    "sales_windows",
    "unique_visitors",
    "web_sessions",
    "search_ctr",
    "customer_profiles",
    "enriched_clicks",
    "order_alerts",
    "customer_orders",  # after order_state: they fold order_state's output stream
    "customer_alerts",
    "archive",
)
ALERTS = ("order_alerts", "customer_alerts")  # their insights go to the local webhook
_CATCH_UP_TIMEOUT_S = 600.0
_TAKEOVER_TIMEOUT_S = 120.0


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _wait_for_takeover(
    registry: GenerationRegistry, generation: int, processor: GroupProcess
) -> bool:
    """Wait until ``processor`` holds ``generation``'s lease (it follows the live alias)."""
    deadline = time.monotonic() + _TAKEOVER_TIMEOUT_S
    while time.monotonic() < deadline and processor.alive():
        if f":{processor.pid}:" in (registry.lease_owner(generation) or ""):
            return True
        time.sleep(0.2)
    return False


def wait_until_caught_up(
    reader: StateReader,
    offsets: LogOffsets,
    topics: list[str],
    *,
    generation: int | None = None,
    timeout: float = _CATCH_UP_TIMEOUT_S,
    alive: Callable[[], bool] | None = None,
    desc: str = "processing",
) -> float:
    """Block until the generation's applied positions reach the log end of every partition.

    Returns:
        Seconds waited.

    Raises:
        TimeoutError: Not caught up within ``timeout``.
        RuntimeError: ``alive`` says the processor died.
    """
    tps = [(t, p) for t in topics for p in offsets.partitions(t)]
    ends = offsets.end_offsets(tps)
    total = sum(ends.values())
    started = time.monotonic()
    with progress_bar(total=total, unit="ev", desc=desc) as bar:
        while True:
            gen = generation
            if gen is None:
                gen = reader.registry.live()
            positions = reader.freshness(gen) if gen is not None else {}
            done = sum(min(positions.get(tp, 0), end) for tp, end in ends.items())
            move_to(bar, done)
            if done >= total:
                return time.monotonic() - started
            if alive is not None and not alive():
                msg = "the processor exited before catching up"
                raise RuntimeError(msg)
            if time.monotonic() - started > timeout:
                msg = f"not caught up after {timeout:.0f}s ({done} of {total})"
                raise TimeoutError(msg)
            time.sleep(0.25)


def _summary(reader: StateReader, generation: int, dead_letters: int) -> None:
    totals = reader.aggregate("order_totals", generation).value
    by_status = {k.split(":", 1)[1]: v for k, v in totals.items() if k.startswith("orders:")}
    revenue = {k.split(":", 1)[1]: v for k, v in totals.items() if k.startswith("revenue")}
    print(f"orders by status (generation {generation}):")
    for status, count in sorted(by_status.items(), key=lambda kv: -kv[1]):
        print(f"  {status:<10} {count:>8,}")
    print(f"  {'total':<10} {sum(by_status.values()):>8,}")
    print("revenue (paid and shipped orders):")
    for currency, minor in sorted(revenue.items()):
        print(f"  {currency}  {money(minor):>16}")
    print(f"dead letters (rejected or undecodable events): {dead_letters}")
    examples = reader.get_many("orders", ["ord-0000001", "ord-0000002", "ord-0000003"], generation)
    print("example orders:")
    for order_id, state in examples.value.items():
        if state is None:
            continue
        lines = ", ".join(f"{sku} x{line['qty']}" for sku, line in sorted(state["lines"].items()))
        print(
            f"  {order_id}  {state['status']:<9} {money(state['total_minor']):>10} "
            f"{state['currency']}  {state['items']} items [{lines}]  "
            f"({state['events']} events)"
        )
    positions = reader.freshness(generation)
    applied = "  ".join(f"p{p}={o:,}" for (_t, p), o in sorted(positions.items()))
    print(f"freshness (next offset per partition): {applied}")


def _wait_for_lookups(client: redis.Redis, timeout: float = 60.0) -> None:
    """Block until enriched_clicks has joined every click customer_profiles' watermark passed.

    Its joiner runs beside its batches and, once it is idle, every second: the table's
    watermark moves with customer_profiles' batches.
    """
    table = GenerationRegistry.of(client, "customer_profiles")
    event_time = processor_spec("customer_profiles").event_time
    lateness = 0 if event_time is None else event_time.lateness_ms
    clicks = StateLayout("enriched_clicks").generation(
        StateReader(client, "enriched_clicks").live_generation()
    )
    deadline = time.monotonic() + timeout
    while True:
        live = table.live()
        watermark = (
            None if live is None else generation_watermark(client, table.keys(live), lateness)
        )
        due = (
            0
            if watermark is None
            else client.zcount(clicks.timers(PENDING_TIMERS), "-inf", f"({watermark}")
        )
        if not due:
            return
        if time.monotonic() > deadline:
            msg = f"enriched_clicks has not joined {due} clicks after {timeout:.0f}s"
            raise TimeoutError(msg)
        time.sleep(0.25)


def _wait_for_deliveries(
    store: WebhookStore, offsets: LogOffsets, topics: list[str], timeout: float = 120.0
) -> float:
    """Block until the dispatcher has settled every insight on ``topics`` (delivered or DLQ)."""
    tps = [(t, p) for t in topics for p in offsets.partitions(t)]
    ends = offsets.end_offsets(tps)
    started = time.monotonic()
    while any(store.positions().get(tp, 0) < end for tp, end in ends.items()):
        if time.monotonic() - started > timeout:
            msg = f"the webhook dispatcher has not settled the insights after {timeout:.0f}s"
            raise TimeoutError(msg)
        time.sleep(0.2)
    return time.monotonic() - started


def _results_out(
    client: redis.Redis,
    receiver: WebhookReceiver,
    store: WebhookStore,
    archive_root: Path,
    produced: dict[str, int],
) -> bool:
    """Insights found and pushed to the webhook; the archive read back with DuckDB."""
    import duckdb  # only here: the demo's reading of the archive

    changes = StateReader(client, "customer_orders").aggregate("order_changes").value
    orders = StateReader(client, PROCESSOR).aggregate("order_totals").value
    terminal = {s: changes.get(f"to:{s}", 0) for s in ("shipped", "cancelled")}
    print(
        "customer_orders (chained on order_state.changes, deduplicated by origin id): "
        + ", ".join(f"{n:,} orders {s}" for s, n in terminal.items())
        + "; each once, as order_state counts them: "
        + ("yes" if all(orders.get(f"orders:{s}") == n for s, n in terminal.items()) else "NO")
    )
    for name in ALERTS:
        counts = StateReader(client, name).aggregate("insight_counts").value
        found = ", ".join(
            f"{k.split(':', 1)[1]} {v}"
            for k, v in sorted(counts.items())
            if k.startswith("insights:")
        )
        waiting = counts.get("buffered", 0)
        print(f"{name}: insights {found or 'none yet'}; {waiting:,} events wait for the watermark")
    seen = receiver.snapshot()
    counters = store.counters()
    print(
        f"webhook {receiver.url}: {seen['accepted']:,} critical insights received "
        f"({counters.get('skipped', 0):,} of other severities not pushed; {seen['requests']:,} "
        f"requests: {counters.get('retried', 0):,} retried after a 503, {seen['duplicates']} "
        f"duplicates by Idempotency-Key), {counters.get('failed', 0)} dead-lettered"
    )
    example = next(iter(receiver.accepted.values()), None)
    if isinstance(example, dict):
        insight = example.get("data", {})
        print(
            f"  e.g. Idempotency-Key {example.get('id')}: {insight.get('pattern')} on "
            f"{insight.get('key')} at {clock(int(insight.get('detected_at', 0)))} "
            f"({', '.join(f'{k} {v}' for k, v in insight.get('details', {}).items())})"
        )
    tables = sorted(d.name for d in archive_root.iterdir() if not d.name.startswith("_"))
    connection = duckdb.connect()
    rows = {}
    for table in tables:
        counted = connection.execute(
            "SELECT count(*) FROM read_parquet(?)", [f"{archive_root / table}/*/*.parquet"]
        ).fetchone()
        rows[table] = 0 if counted is None else int(counted[0])
    exact = rows == {t: n for t, n in produced.items() if n}
    print(
        f"archive {archive_root}: {len(tables)} Parquet tables by event date, "
        f"{sum(rows.values()):,} rows read back by DuckDB; equal to the events produced per type: "
        f"{'yes' if exact else 'NO'}"
    )
    paid = connection.execute(
        "SELECT event_date, currency, count(*) AS payments, sum(amount_minor) AS minor "
        "FROM read_parquet(?, hive_partitioning = true) GROUP BY ALL ORDER BY ALL LIMIT 3",
        [f"{archive_root}/OrderPaid/*/*.parquet"],
    ).fetchall()
    for day, currency, payments, minor in paid:
        print(f"  {day} {currency}: {payments:,} payments, {money(minor)}")
    return exact


def _tables(reader: StateReader, generation: int) -> tuple[dict[str, Any], dict[str, int]]:
    return (
        dict(reader.scan("orders", generation)),
        reader.aggregate("order_totals", generation).value,
    )


def _produce(
    kafka: KafkaSettings, orders: int
) -> tuple[list[SimulatedEvent], list[SimulatedEvent]]:
    """Produce the orders and a clickstream of the same customers: (order events, all)."""
    simulator = OrderSimulator(orders, seed=2026)
    order_events = list(simulator)
    web = list(
        ClickstreamSimulator(
            max(1, orders // 3),
            seed=2026,
            customer_ids=simulator.customer_ids,
            registered_by=first_orders(order_events),  # every ordering customer has a profile
        )
    )
    events = order_events + web
    _say(
        f"producing {len(order_events):,} order events for {orders:,} orders and "
        f"{len(web):,} clickstream and customer events"
    )
    publisher = EventPublisher(kafka)
    started = time.monotonic()
    with progress_bar(total=len(events), unit="ev", desc="producing") as bar:
        tokens = publisher.emit_many(events, on_progress=bar.update)
    publisher.close()
    produced_s = time.monotonic() - started
    print(
        f"{len(tokens):,} events acknowledged (acks=all) in {produced_s:.1f}s; last: {tokens[-1]}"
    )
    return order_events, events


@dataclass(frozen=True, slots=True)
class _Running:
    """The demo's stack and its live processor, as the replay phase uses them."""

    kafka: KafkaSettings
    redis_settings: RedisSettings
    client: redis.Redis
    launcher: ProcessLauncher
    demo_dir: Path
    processor: GroupProcess


def _delete_head(running: _Running) -> None:
    """Delete the first half of order_state's topic, as its retention would; print what."""
    (topic,) = processor_spec(PROCESSOR).topics
    with LogOffsets(running.kafka.as_librdkafka()) as offsets:
        ends = offsets.end_offsets([(topic, p) for p in offsets.partitions(topic)])
    cut = {tp: end // 2 for tp, end in ends.items()}
    config: dict[str, str | int | float | bool] = {**running.kafka.as_librdkafka()}
    admin = AdminClient(config)
    requests = [TopicPartition(t, p, offset) for (t, p), offset in cut.items()]
    for future in admin.delete_records(requests).values():
        future.result(timeout=30)
    _say(f"retention: the head of {topic} is deleted; the archive keeps it")
    print(
        f"deleted the first {sum(cut.values()):,} of {sum(ends.values()):,} records of {topic}, "
        "half of each partition (delete_records, what retention.ms does after its time)"
    )


def _replay(running: _Running, live: int) -> bool:
    """Rebuild order_state online from all of history, flip readers, compare; True if identical.

    Its topic's head is deleted first: the rebuild reads it from the archive (the log's cold
    tier), then the log.
    """
    client, prefix = running.client, running.redis_settings.key_prefix
    reader = StateReader(client, PROCESSOR, prefix)
    _delete_head(running)
    _say(
        "replay: rebuild order_state from all of history into a new generation (the archive "
        "below each partition's log start, then the log)"
    )
    spec = processor_spec(PROCESSOR)
    plan = plan_replay(
        spec, ToEarliest(), running.kafka, client, prefix, archive_root=running.demo_dir / "archive"
    )
    print(plan.render())  # its ARCHIVE column and retention check say what the archive serves
    print(f"readers keep seeing generation {reader.live_generation()} meanwhile")
    with progress_bar(total=plan.total_events, unit="ev", desc="rebuilding") as bar:

        def _progress(progress: RebuildProgress) -> None:
            bar.total = progress.total
            move_to(bar, progress.done, f"lag {sum(progress.lag.values())}")

        result = run_rebuild(
            plan,
            spec,
            running.kafka,
            running.redis_settings,
            state_dir=running.demo_dir,
            on_progress=_progress,
            launcher=running.launcher,
        )
    print(
        f"generation {result.generation} built from {result.events:,} events in "
        f"{result.seconds:.1f}s; alias flipped from {result.previous} to {result.generation}"
    )
    before = _tables(reader, live)
    after = _tables(reader, result.generation)
    same = before == after
    print(
        f"rebuilt state identical to generation {live}: "
        f"{'yes' if same else 'NO'} ({len(after[0]):,} orders, "
        f"{len(after[1])} counters compared key by key)"
    )
    print(f"readers now see generation {reader.live_generation()}")
    registry = GenerationRegistry.of(client, PROCESSOR, prefix)
    processor = running.processor
    taken_over = _wait_for_takeover(registry, result.generation, processor)
    print(
        f"the live processor (pid {processor.pid}) "
        + (
            f"followed the alias and now folds generation {result.generation}"
            if taken_over
            else f"has not taken generation {result.generation} over yet"
        )
    )
    for info in registry.list():
        print(f"  generation {info.generation}: {info.status}")
    return same


def _create_topics(kafka: KafkaSettings) -> list[str]:
    """Create the processors' topics, dead-letter topics and insight topics; the insight ones."""
    registry = default_registry()
    topics = [registry.topic(t) for n in PROCESSORS for t in processor_spec(n).topics]
    topics = list({t.name: t for t in topics}.values())
    ensure_topics(kafka.as_librdkafka(), [*topics, *(dead_letter_spec(n) for n in PROCESSORS)])
    insight_topics = [default_insights_topic(n) for n in ALERTS]
    ensure_topics(kafka.as_librdkafka(), [effects_spec(t) for t in insight_topics])
    for topic in topics:
        print(f"topic {topic.name}: {topic.partitions} partitions, key {topic.key_field}")
    return insight_topics


def _catch_up(running: _Running, offsets: LogOffsets, order_events: list[SimulatedEvent]) -> int:
    """Wait for every processor, then print what they hold; the live order_state generation."""
    client = running.client
    _say("waiting for the processors to catch up")
    waited = 0.0
    for name in PROCESSORS:
        waited += wait_until_caught_up(
            StateReader(client, name),
            offsets,
            list(processor_spec(name).topics),
            alive=running.processor.alive,
            desc=name,
        )
    print(f"caught up {waited:.1f}s after the last event was acknowledged")
    _wait_for_lookups(client)
    reader = StateReader(client, PROCESSOR)
    dlq = dead_letter_spec(PROCESSOR).name
    dead = sum(offsets.end_offsets([(dlq, 0)]).values())
    live = reader.live_generation()
    _summary(reader, live, dead)
    platform_summary(client, order_events)
    windows_summary(client)
    return live


def run_demo(orders: int, state_dir: Path) -> int:
    """Run the whole demo; returns the exit code."""
    demo_dir = state_dir / "demo"
    shutil.rmtree(demo_dir, ignore_errors=True)
    # Each stop runs whatever the one before it raised (the dispatcher re-raises its own
    # error when stopped): the stack's broker and Redis must never be left behind.
    with contextlib.ExitStack() as stops:
        stack = LocalStack(demo_dir / "stack", free_port(), free_port())
        _say(f"starting the local stack (Apache Kafka + redis-server) in {demo_dir}")
        stops.callback(stack.stop)
        stack.start()
        kafka = KafkaSettings(bootstrap_servers=stack.bootstrap_servers)
        redis_settings = RedisSettings(url=stack.redis_url)
        print(f"Kafka {stack.bootstrap_servers}, Redis {stack.redis_url}")
        insight_topics = _create_topics(kafka)
        # A local webhook receiver that answers 503 to every 7th request (the dispatcher
        # retries it), and the dispatcher pushing the alert processors' insights to it.
        receiver = WebhookReceiver(fail_every=7).start()
        stops.callback(receiver.stop)
        client = redis_client(stack.redis_url)
        webhook = WebhookSettings(
            name="demo", url=receiver.url, topics=tuple(insight_topics), backoff_max_s=2.0
        )
        dispatcher = WebhookDispatcher(
            webhook, kafka.as_librdkafka(), client, redis_settings.key_prefix
        )
        stops.callback(dispatcher.start().stop)
        print(f"webhook receiver {receiver.url}; dispatcher of {', '.join(insight_topics)}")
        launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), demo_dir)
        _say(
            f"starting {', '.join(PROCESSORS)} as queries of ONE Spark application "
            "(generation 1 each; customer_stats is re-keyed by customer_id; customer_alerts "
            "folds order_state's output stream)"
        )
        processor = GroupProcess(
            launcher.argv(list(PROCESSORS)),
            launcher.env(),
            demo_dir / "logs" / "processors-live.log",
        ).start()
        stops.callback(processor.stop)
        print(f"pid {processor.pid}, log {processor.log_path}")
        service = start_service(
            client, redis_settings.key_prefix, launcher.env(), demo_dir / "logs" / "serve.log"
        )
        stops.callback(service.stop)
        print(f"refold serve: {service.url}/docs (API), {service.url}/metrics")
        print(f"dashboard (live while the demo runs): {service.dashboard}")

        order_events, events = _produce(kafka, orders)
        running = _Running(kafka, redis_settings, client, launcher, demo_dir, processor)
        offsets = LogOffsets(kafka.as_librdkafka())
        stops.callback(offsets.close)
        live = _catch_up(running, offsets, order_events)
        _wait_for_deliveries(dispatcher.store, offsets, insight_topics)

        before_replay = receiver.snapshot()["requests"]
        same = _replay(running, live)
        _wait_for_deliveries(dispatcher.store, offsets, insight_topics)
        during = receiver.snapshot()["requests"] - before_replay
        print(
            f"webhook requests while replay built and flipped: {during} (a generation being "
            "built does not send what the live one sent)"
        )

        _say("results out: insights pushed to the webhook, the archive read back")
        archived = _results_out(
            client,
            receiver,
            dispatcher.store,
            demo_dir / "archive",
            Counter(event_type for event_type, _event in events),
        )
        _say("serving: write over HTTP, read your own write with its consistency token")
        fresh = next(iter(OrderSimulator(1, seed=99)))
        read_your_write(service, fresh[0], {**fresh[1], "order_id": "o-demo-http"})
        _say(
            "stopping the service, the live processor, the webhook dispatcher and receiver, "
            "and the stack"
        )
    print("done: every process the demo started has stopped.")
    return 0 if same and archived else 1
