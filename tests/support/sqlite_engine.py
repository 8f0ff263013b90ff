"""A toy engine added through refold's public API only: records per Kafka key into SQLite.

A user's package, as the Spark test installs it in a site directory: it imports ``refold`` and
``refold.extend`` and nothing else of refold's. Importing it registers the engine, which runs
every :class:`RecordsPerKey` processor: each micro-batch's records are counted per Kafka key
and upserted into a SQLite table in one SQLite transaction with the batch id, and a batch id
already there is skipped. Spark runs a batch again with the same id after a crash, so each
batch is applied exactly once.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from refold import ProcessorOptions, ProcessorSpec
from refold.extend import Engine, QueryStart, register_engine

NAME = "records_per_key"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, count INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS batches (batch_id INTEGER PRIMARY KEY, records INTEGER NOT NULL)",
)


class SqliteOptions(ProcessorOptions):
    """The processor's options: where its SQLite database is."""

    database: str = ""


class RecordsPerKey:
    """The processor: its name, the event types it reads (its code identity) and its database."""

    event_types = (
        "OrderPlaced",
        "OrderLineAdded",
        "OrderLineRemoved",
        "OrderPaid",
        "OrderShipped",
        "OrderCancelled",
    )

    def __init__(self, name: str, database: str) -> None:
        self.name = name
        self.database = database


@dataclass
class SqliteTotal:
    """What the sink did since it started."""

    batches: int = 0
    records: int = 0
    skipped: int = 0

    def describe(self) -> str:
        """One line for the log."""
        return f"{self.batches} batches, {self.records} records, {self.skipped} batches skipped"


class SqliteSink:
    """The ``foreachBatch`` function: one SQLite transaction per batch, keyed by its id."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.total = SqliteTotal()

    def __call__(self, frame: Any, batch_id: int) -> None:
        counts = Counter(row.key.decode() for row in frame.select("key").collect())
        with closing(sqlite3.connect(self.database, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            if db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone():
                db.execute("ROLLBACK")
                self.total.skipped += 1
                return
            db.executemany(
                "INSERT INTO records (key, count) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET count = count + excluded.count",
                counts.items(),
            )
            db.execute("INSERT INTO batches VALUES (?, ?)", (batch_id, counts.total()))
            db.execute("COMMIT")
        self.total.batches += 1
        self.total.records += counts.total()


class SqliteEngine(Engine):
    """Runs :class:`RecordsPerKey` processors: Spark's record rows -> SQLite."""

    name = "sqlite"
    called = "a SQLite processor"

    def matches(self, projection: object) -> bool:
        """A :class:`RecordsPerKey`."""
        return isinstance(projection, RecordsPerKey)

    def start(self, start: QueryStart) -> tuple[SqliteSink, Any]:
        """Create the tables, then wire the source to the sink."""
        database = start.projection.database  # type: ignore[attr-defined]
        with closing(sqlite3.connect(database)) as db:
            for statement in SCHEMA:
                db.execute(statement)
        sink = SqliteSink(database)
        query = (
            start.source()
            .writeStream.foreachBatch(sink)
            .queryName(start.query_name)
            .option("checkpointLocation", start.checkpoint)
            .trigger(processingTime=start.trigger_interval)
            .start()
        )
        return sink, query


register_engine(SqliteEngine())


def build(options: SqliteOptions) -> RecordsPerKey:
    """The processor, from its options."""
    return RecordsPerKey(NAME, options.database)


RECORDS_PER_KEY = ProcessorSpec(
    name=NAME,
    projection="tests.support.sqlite_engine:build",
    topics=("commerce.orders",),
    key="order_id",
    tables=(),
    options="tests.support.sqlite_engine:SqliteOptions",
)
