"""An engine added through the public extension API (``refold.extend``) runs on real Spark.

The engine (tests/support/sqlite_engine.py) is a user's package here: it imports ``refold`` and
``refold.extend`` only, and a site directory registers its processor under
``refold.processors`` for the processor processes, as an installed package would. Its processor
counts records per Kafka key into SQLite, one SQLite transaction per micro-batch with the batch
id. Killed with -9 mid-stream and started again, it ends with every record counted once: the
counts equal the keys of the events on the topic.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

from refold.contracts.commerce import ORDERS
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.deploy.simulators.orders import OrderSimulator
from refold.services.producer.publisher import EventPublisher
from tests.support import sqlite_engine
from tests.support.sqlite_engine import NAME, SqliteOptions
from tests.support.waiting import assert_eventually

MODULE = "sqlite_engine_site"


def _site(site: Path) -> None:
    """The engine's package as installed: a module and a dist-info naming its spec."""
    site.mkdir()
    source = Path(sqlite_engine.__file__).read_text()
    (site / f"{MODULE}.py").write_text(source.replace("tests.support.sqlite_engine", MODULE))
    dist = site / f"{MODULE}-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sqlite-site\nVersion: 0.1\n")
    entry = f"[refold.processors]\n{NAME} = {MODULE}:RECORDS_PER_KEY\n"
    (dist / "entry_points.txt").write_text(entry)


def test_the_package_imports_only_refolds_public_names() -> None:
    tree = ast.parse(Path(sqlite_engine.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert {m for m in imported if m.startswith("refold")} == {"refold", "refold.extend"}


def _counted(database: Path) -> tuple[dict[str, int], int]:
    """The counts per key, and the records of the batches applied (0 before the tables)."""
    if not database.exists():
        return {}, 0
    with closing(sqlite3.connect(database)) as db:
        try:
            counts = dict(db.execute("SELECT key, count FROM records").fetchall())
            (records,) = db.execute("SELECT coalesce(sum(records), 0) FROM batches").fetchone()
        except sqlite3.OperationalError:  # the tables are not there yet
            return {}, 0
    return counts, records


def test_an_added_engine_applies_each_batch_once_through_a_kill_9(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path, monkeypatch
):
    _site(tmp_path / "site")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the processes' (GroupProcess adds os.environ)
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    database = tmp_path / "records.sqlite"
    options = SqliteOptions(
        topics=[orders],
        dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
        database=str(database),
        source_format="refold_kafka",  # record rows, for its foreachBatch to count
        max_offsets_per_trigger=400,
    )
    launcher = ProcessLauncher(
        kafka,
        RedisSettings(url=redis_url, key_prefix=f"test-{unique}"),
        SparkSettings(),
        tmp_path,
        {NAME: options},
    )
    events = list(OrderSimulator(400, seed=3))
    publisher = EventPublisher(kafka, topics=[dataclasses.replace(ORDERS, name=orders)])
    half = len(events) // 2
    processes = []
    try:
        publisher.emit_many(events[:half])
        process = GroupProcess(launcher.argv([NAME]), launcher.env(), tmp_path / "run-1.log")
        processes.append(process.start())
        assert_eventually(
            lambda: _counted(database)[1] > 0,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(events[half:])
        process.kill()  # kill -9, with batches still to apply
        process = GroupProcess(launcher.argv([NAME]), launcher.env(), tmp_path / "run-2.log")
        processes.append(process.start())
        expected = Counter(str(event["order_id"]) for _type, event in events)
        assert_eventually(
            lambda: _counted(database) == (dict(expected), len(events)),
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        process.stop()
        assert f"{NAME} generation 1 stopped: " in process.log_tail()
    finally:
        for running in processes:
            running.stop()
        publisher.close()
