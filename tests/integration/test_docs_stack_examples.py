"""The docs' ``stack`` examples run against a real Redis and broker, as a user runs them.

Each ```` ```python stack ```` block (tests/support/doc_blocks.py) reads what a running stack
holds; here it runs as a script with ``REFOLD_*`` pointed at the test session's Redis (a unique
key prefix) and broker, the guide's package on the path. Before it runs, it is given what it
reads:

- the topics it reads are created, and the processors it reads get a live generation 1 holding
  state: an aggregate, and window buckets written by the envelope's window writes
  (:func:`write_windows`) from the fold's measures;
- an archive (``archive/`` in its working directory): a few days of orders published to a topic
  and archived by the archive's own task function (:func:`archive_ranges`, as Spark calls it);
- the HTTP API (``RefoldClient``): the service under uvicorn, an API key with the ``ingest`` and
  ``query`` scopes (``REFOLD_URL``, ``REFOLD_KEY``), and order_state's live generation with a
  thread folding what the ingest writes (FoldWriter, the processor's envelope), so a read with a
  consistency token is answered.

The example that starts a SparkSession is marked ``spark`` too (``-m "not spark"`` leaves it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.topics import TopicSpec
from refold.deploy.serve_cli import build_app
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import ArchiveProcessor
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.windows import WindowDelta, WindowFold
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.archive.sink import ArchivePlan, archive_ranges
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.processors.runtime.kafka_ranges import read_log
from refold.processors.runtime.window_writes import write_windows
from refold.processors.unique_visitors.projection import UniqueVisitors
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.auth import ApiKeyStore
from refold.services.producer.publisher import EventPublisher
from tests.support.doc_blocks import ROOT, DocBlock, assemble_guide_package, python_blocks
from tests.support.served import served

STACK_BLOCKS = [
    pytest.param(b, id=b.where, marks=[pytest.mark.spark] if "SparkSession" in b.text else [])
    for b in python_blocks()
    if "stack" in b.words
]
# A script that imports refold and reads a few keys, or starts a local SparkSession (10-40 s
# on a busy machine); the session's Redis may be busy.
RUN_TIMEOUT_S = 120
DAY, HOUR = 1_767_225_600_000, 3_600_000  # the day the examples read (2026-01-01)
ARCHIVED_ORDERS = 12  # placed every 6 h from 2026-01-01: three days of orders and payments
# The fold thread's pause between reads of the log (the processor's trigger interval).
FOLD_EVERY_S = 0.2
RETENTION_MS = 7 * 24 * HOUR  # the buckets outlive the test
# The topics an example reads, created before it runs as the processor that writes them would.
TOPICS = ("order_alerts.insights",)
# What each processor an example reads holds before it runs: an aggregate, as its fold
# would write it.
AGGREGATES: Mapping[str, tuple[str, Mapping[str, int]]] = {
    "search_ctr": ("ctr", {"searches:shoes": 4, "clicked:shoes": 1}),
    "enriched_clicks": ("clicks_by_customer", {"clicks": 3, "tier:GOLD": 1, "anonymous": 1}),
    "order_alerts": ("insight_counts", {"insights": 2, "insights:paid_not_shipped": 2}),
}


def _window_fold(name: str, package: Path) -> tuple[WindowFold, str, Iterable[dict[str, Any]]]:
    """A window processor an example reads, its event-time field and a day of its events."""
    if name == "unique_visitors":
        visits = (
            {"visitor_id": f"v{n % 7}", "device": ("mobile", "desktop")[n % 2], "at": n}
            for n in range(40)
        )
        return (
            UniqueVisitors(),
            "occurred_at",
            ({**v, "occurred_at": DAY + v.pop("at") * 30 * 60_000} for v in visits),
        )
    sys.path.insert(0, str(package))
    try:
        from shop_insights.review_windows import ReviewWindows
    finally:
        sys.path.remove(str(package))
    reviews = (
        {"customer_id": f"c{n % 5}", "stars": 1 + n % 5, "posted_at": DAY + n * 20 * 60_000}
        for n in range(60)
    )
    return ReviewWindows(), "posted_at", reviews


def _seed(client: redis.Redis, prefix: str, block: DocBlock, package: Path, bootstrap: str) -> None:
    topics = [t for t in TOPICS if f'"{t}"' in block.text]
    if topics:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(t, 1) for t in topics]).values():
            with contextlib.suppress(KafkaException):  # there already: another run made it
                future.result(30)
    for name, (aggregate, values) in AGGREGATES.items():
        if f'"{name}"' in block.text:
            registry = GenerationRegistry.of(client, name, prefix)
            keys = registry.keys(registry.create({}, live=True))
            client.hset(keys.aggregate(aggregate), mapping=dict(values))
    for name in ("unique_visitors", "review_windows"):
        if name not in block.text and name.title().replace("_", "") not in block.text:
            continue
        fold, field, events = _window_fold(name, package)
        registry = GenerationRegistry.of(client, fold.name, prefix)
        generation = registry.create({}, live=True)
        delta = WindowDelta()
        event_type = fold.event_types[0]
        for event in events:
            for measure in fold.measure(event_type, event):
                delta.add(fold.windows, event_time_ms(event, field), measure, RETENTION_MS)
        with client.pipeline(transaction=True) as pipe:
            write_windows(pipe, StateLayout(fold.name, prefix).generation(generation), delta)
            pipe.execute()


@dataclasses.dataclass(frozen=True)
class _Stack:
    """The session's stack, as one example sees it: its key prefix and topic maker."""

    redis_url: str
    bootstrap: str
    prefix: str
    make_topic: Callable[..., str]

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.bootstrap)

    def target(self, processor: str) -> FoldTarget:
        """Generation 1 of ``processor``, its dead letters to a topic of this test."""
        dlq = self.make_topic(1, prefix="dlq")
        kafka = (("bootstrap.servers", self.bootstrap),)
        return FoldTarget(processor, 1, self.redis_url, self.prefix, kafka, dlq)

    def orders_topic(self) -> tuple[str, TopicSpec]:
        name = self.make_topic(partitions=2, prefix="orders")
        return name, dataclasses.replace(ORDERS, name=name, partitions=2)


def _orders(count: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Orders placed every 6 h from 2026-01-01 and paid an hour later."""
    for n in range(count):
        order, at, currency = f"o-{n}", DAY + n * 6 * HOUR, ("EUR", "USD")[n % 2]
        line = {"sku": f"sku-{n % 3}", "qty": 1 + n % 2, "unit_price_minor": 1250}
        placed = {
            "event_id": f"{order}-placed",
            "order_id": order,
            "customer_id": f"c-{n % 4}",
            "lines": [line],
            "currency": currency,
            "placed_at": at,
            "channel": "web",
            "coupon_code": None,
        }
        yield "OrderPlaced", placed
        paid = {
            "event_id": f"{order}-paid",
            "order_id": order,
            "amount_minor": line["qty"] * line["unit_price_minor"],
            "currency": currency,
            "payment_method": "CARD",
            "paid_at": at + HOUR,
        }
        yield "OrderPaid", paid


def _archive(root: Path, stack: _Stack) -> None:
    """Orders over three days, archived under ``root`` by the archive's task function."""
    topic, spec = stack.orders_topic()
    publisher = EventPublisher(stack.kafka, topics=[spec])
    publisher.emit_many(list(_orders(ARCHIVED_ORDERS)))
    publisher.close()
    with LogOffsets(stack.kafka.as_librdkafka()) as offsets:
        ends = offsets.end_offsets([(topic, p) for p in offsets.partitions(topic)])
    target = stack.target("archive")
    registry = GenerationRegistry.of(redis_client(stack.redis_url), "archive", stack.prefix)
    registry.create({}, live=True)  # as the runner does before the generation's first batch
    registry.set_positions(1, {position_field(t, p): 0 for t, p in ends})
    archive = ArchiveProcessor("archive", root, ("OrderPlaced", "OrderPaid"), DATES)
    ranges = tuple((t, p, 0, end) for (t, p), end in sorted(ends.items()))
    outcome = archive_ranges(ArchivePlan(target, archive, EventCodec()), ranges, batch_id=0)
    assert outcome.archived == 2 * ARCHIVED_ORDERS


@contextlib.contextmanager
def _served_api(stack: _Stack) -> Iterator[dict[str, str]]:
    """The HTTP API with keys on, order_state folded as it ingests; yields the example's env."""
    topic, spec = stack.orders_topic()
    client = redis_client(stack.redis_url)
    registry = GenerationRegistry.of(client, "order_state", stack.prefix)
    registry.create({"topics": f'["{topic}"]'}, live=True)
    key = ApiKeyStore(client, stack.prefix).add("docs", ["ingest", "query"])
    settings = ServeSettings(
        kafka=stack.kafka,
        redis=RedisSettings(url=stack.redis_url, key_prefix=stack.prefix),
        # A loaded machine: wait for the fold up to just under the client's 10 s timeout.
        serve=HttpSettings(auth="keys", default_wait_ms=9_000),
    )
    context = ServiceContext(settings, client, [spec])
    target = stack.target("order_state")
    stop = threading.Event()
    failures: list[BaseException] = []

    def fold() -> None:  # order_state's processor: apply what is in the log, again and again
        try:
            while not stop.wait(FOLD_EVERY_S):
                kafka = dict(target.kafka)
                records = [SourceRecord.of_message(m) for c in read_log(kafka, topic) for m in c]
                if records:
                    FoldWriter(target, OrderStateProjection()).apply(
                        records, batch_id=int(time.time() * 1000)
                    )
        except BaseException as exc:
            failures.append(exc)
            raise

    folder = threading.Thread(target=fold, name="order_state fold", daemon=True)
    try:
        with served(build_app(settings, context)) as url:
            folder.start()
            yield {"REFOLD_URL": url, "REFOLD_KEY": key}
    finally:
        stop.set()
        if folder.is_alive():
            folder.join(timeout=30)
        context.close()
    assert failures == []


@pytest.mark.parametrize("block", STACK_BLOCKS)
def test_a_stack_example_runs_against_the_stack(
    block: DocBlock, redis_url, kafka_bootstrap, make_topic, unique, tmp_path: Path
) -> None:
    package, cwd = tmp_path / "guide", tmp_path / "cwd"
    package.mkdir()
    cwd.mkdir()
    assemble_guide_package(package)
    stack = _Stack(redis_url, kafka_bootstrap, f"docs-{unique}", make_topic)
    _seed(redis_client(redis_url), stack.prefix, block, package, kafka_bootstrap)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFOLD_")}
    env.update(
        PYTHONPATH=os.pathsep.join((str(package), str(ROOT))),
        REFOLD_REDIS__URL=redis_url,
        REFOLD_REDIS__KEY_PREFIX=stack.prefix,
        REFOLD_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
    )
    if '"archive/' in block.text:
        _archive(cwd / "archive", stack)
    with contextlib.ExitStack() as running:
        if "RefoldClient" in block.text:
            env.update(running.enter_context(_served_api(stack)))
        result = subprocess.run(
            [sys.executable, "-c", block.text],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    assert result.returncode == 0, f"{block.where}:\n{block.text}\n{result.stderr[-3000:]}"
