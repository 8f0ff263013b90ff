"""The docs' ``stack`` examples run against a real Redis and broker, as a user runs them.

Each ```` ```python stack ```` block (tests/support/doc_blocks.py) reads the stack through
``StackSettings()``; here it runs as a script with ``REFOLD_*`` pointed at the test session's
Redis (a unique key prefix) and broker, the guide's package on the path. Before it runs, the
topics it reads are created, and the processors it reads get a live generation 1 holding
state: an aggregate, and window buckets written by the envelope's window writes
(:func:`write_windows`) from the fold's measures.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from refold.contracts.layout import StateLayout
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.windows import WindowDelta, WindowFold
from refold.processors.runtime.window_store import write_windows
from refold.processors.unique_visitors.projection import UniqueVisitors
from tests.support.doc_blocks import ROOT, DocBlock, assemble_guide_package, python_blocks

STACK_BLOCKS = [b for b in python_blocks() if "stack" in b.words]
# A script that imports refold and reads a few keys; the session's Redis may be busy.
RUN_TIMEOUT_S = 120
DAY, HOUR = 1_767_225_600_000, 3_600_000  # the day the examples read (2026-01-01)
RETENTION_MS = 7 * 24 * HOUR  # the buckets outlive the test
# The topics an example reads, created before it runs as the processor that writes them would.
TOPICS = ("order_patterns.insights",)
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


@pytest.mark.parametrize("block", STACK_BLOCKS, ids=lambda b: b.where)
def test_a_stack_example_runs_against_the_stack(
    block: DocBlock, redis_url, kafka_bootstrap, unique, tmp_path: Path
) -> None:
    package, cwd = tmp_path / "guide", tmp_path / "cwd"
    package.mkdir()
    cwd.mkdir()
    assemble_guide_package(package)
    prefix = f"docs-{unique}"
    _seed(redis.Redis.from_url(redis_url), prefix, block, package, kafka_bootstrap)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFOLD_")}
    env.update(
        PYTHONPATH=os.pathsep.join((str(package), str(ROOT))),
        REFOLD_REDIS__URL=redis_url,
        REFOLD_REDIS__KEY_PREFIX=prefix,
        REFOLD_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
    )
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
