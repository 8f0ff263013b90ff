"""The archive processor on real Spark, beside order_state in one application, through a kill -9.

Every reference topic (private copies) carries orders, clickstream and account events, and a few
records that do not decode. The archive and order_state run as two queries of one Spark
application; the application is killed (kill -9) mid-stream and started again. Then the Parquet
archive equals the log event for event (by topic, partition and offset: no duplicate, nothing
missing, decoded values equal, each event under its event date), read back with pyarrow, DuckDB
and Spark; the undecodable records are dead letters and nowhere in the archive. Then ``replay
--to-earliest --execute`` of the archive is refused by its processor (an archive is one lineage of
files, not rebuilt into generations), leaving readers and files as they were.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import pytest
from confluent_kafka import Producer

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.archive.config import ArchiveOptions
from refold.processors.archive.projection import DATES
from refold.processors.fold.archive import ArchiveProcessor, Coverage
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.runtime.archive.maintenance import archive_status
from refold.processors.runtime.archive.sink import ArchivePlan
from refold.processors.runtime.envelope import FoldTarget
from refold.replay.errors import RebuildError
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from tests.support.archive import assert_archive_equals_log, log_events
from tests.support.waiting import assert_eventually

GARBAGE = [b"not avro at all", b"\xc3\x01" + b"\x07" * 8 + b"unknown fingerprint", b"\xc3"]


def _in_flight(root: Path, registry: GenerationRegistry) -> bool:
    """Whether some archive file reaches past its partition's applied position."""
    applied = registry.positions(1)[0]
    for path in root.glob("*/event_date=*/*.parquet"):
        cov = Coverage.parse(path.name)
        if cov is not None and cov.end > applied.get((cov.topic, cov.partition), 0):
            return True
    return False


def _log_end(kafka: KafkaSettings, topics: list[str]) -> dict[tuple[str, int], int]:
    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        return offsets.end_offsets([(t, p) for t in topics for p in offsets.partitions(t)])
    finally:
        offsets.close()


def test_the_archive_equals_the_log_through_a_kill_9_read_by_pyarrow_duckdb_and_spark(
    spark, kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    specs = (ORDERS, PAGEVIEWS, SEARCHES, CUSTOMERS)
    names = [make_topic(partitions=s.partitions, prefix=s.name.replace(".", "-")) for s in specs]
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    root = tmp_path / "archive"
    launcher = ProcessLauncher(
        kafka,
        RedisSettings(url=redis_url, key_prefix=prefix),
        SparkSettings(),
        tmp_path,
        {
            "archive": ArchiveOptions(
                topics=names,
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                root=root,
                max_offsets_per_trigger=1_500,  # several micro-batches, crash points between
            ),
            "order_state": OrderStateOptions(
                topics=[names[0]],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                notifications_topic=f"{names[0]}.notifications",
                max_offsets_per_trigger=1_500,
            ),
        },
        log_level="DEBUG",  # the sinks say which batches the driver planned
    )
    publisher = EventPublisher(
        kafka, topics=[dataclasses.replace(s, name=n) for s, n in zip(specs, names, strict=True)]
    )
    orders = list(OrderSimulator(350, seed=31))
    clicks = list(ClickstreamSimulator(150, seed=31))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "archive", prefix)

    def archived() -> int:
        live = registry.live()
        return 0 if live is None else sum(registry.positions(live)[0].values())

    publisher.emit_many(orders[: len(orders) // 2] + clicks[: len(clicks) // 2])
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    for n, value in enumerate(GARBAGE):
        raw.produce(names[0], value, b"ord-garbage", partition=n)
    raw.flush(30)
    argv = launcher.argv(["archive", "order_state"])  # two queries, one Spark application
    process = GroupProcess(argv, launcher.env(), tmp_path / "run-1.log").start()
    processes = [process]
    try:
        first_end = sum(_log_end(kafka, names).values())
        assert_eventually(
            lambda: archived() > 0, timeout=240, alive=process.alive, message=process.log_tail
        )
        later = orders[len(orders) // 2 :] + clicks[len(clicks) // 2 :]
        publisher.emit_many(later[: len(later) // 2])
        assert archived() < sum(_log_end(kafka, names).values())
        # Best effort: kill while a batch's files are written and its positions not moved yet
        # (files past the applied positions), else right after a commit.
        assert_eventually(
            lambda: _in_flight(root, registry) or archived() >= first_end,
            timeout=120,
            interval=0.01,
            alive=process.alive,
            message=process.log_tail,
        )
        process.kill()  # kill -9 of the whole application, mid-stream
        # The rest after the kill: the killed run never saw it, however fast its batches
        # were (once, a run had archived everything by the time it was killed).
        publisher.emit_many(later[len(later) // 2 :])
        assert 0 < archived() < sum(_log_end(kafka, names).values())
        process = GroupProcess(argv, launcher.env(), tmp_path / "run-2.log").start()
        processes.append(process)
        end = _log_end(kafka, names)
        assert_eventually(
            lambda: registry.positions(1)[0] == end,
            timeout=300,
            alive=process.alive,
            message=process.log_tail,
        )
        order_state = GenerationRegistry.of(client, "order_state", prefix)
        orders_end = {tp: o for tp, o in end.items() if tp[0] == names[0]}
        assert_eventually(
            lambda: order_state.positions(1)[0] == orders_end,
            timeout=120,
            alive=process.alive,
            message=process.log_tail,
        )
    finally:
        for running in processes:
            running.stop()
        publisher.close()

    # After a checkpoint's first batch the driver plans the archive's tasks from the offsets
    # log: the run after the kill did (run 1 may have been killed in its first batch).
    planned = [
        line
        for line in (tmp_path / "run-2.log").read_text().splitlines()
        if "processor=archive" in line and "planned from the offsets log" in line
    ]
    assert planned

    # pyarrow: every decodable record of the log, once, with equal values and its event date.
    total = assert_archive_equals_log(root, kafka_bootstrap, names, dates=DATES)
    assert total == sum(end.values()) - len(GARBAGE)
    logged = log_events(kafka_bootstrap, names)
    per_type: dict[str, int] = {}
    for event_type, _data, _record in logged.values():
        per_type[event_type] = per_type.get(event_type, 0) + 1
    assert len(per_type) >= 9

    # DuckDB, reading the Hive partitions as they are.
    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    for event_type, count in per_type.items():
        files = f"{root}/{event_type}/*/*.parquet"
        rows, keys = db.execute(
            "SELECT count(*), count(DISTINCT (kafka_topic, kafka_partition, kafka_offset)) "
            "FROM read_parquet(?, hive_partitioning = true)",
            [files],
        ).fetchone()
        assert (rows, keys) == (count, count), event_type
    paid = [d for t, d, _r in logged.values() if t == "OrderPaid"]
    amount, latest, misdated = db.execute(
        "SELECT sum(amount_minor), max(epoch_ms(paid_at)), "
        "count(*) FILTER (WHERE CAST(paid_at AS DATE) <> event_date) "
        "FROM read_parquet(?, hive_partitioning = true)",
        [f"{root}/OrderPaid/*/*.parquet"],
    ).fetchone()
    assert amount == sum(d["amount_minor"] for d in paid)
    assert latest == max(d["paid_at"] for d in paid)
    assert misdated == 0

    # Spark, discovering the event_date partitions itself.
    placed = spark.read.parquet(str(root / "OrderPlaced"))
    assert "event_date" in placed.columns
    assert placed.count() == per_type["OrderPlaced"]
    assert (
        placed.select("kafka_topic", "kafka_partition", "kafka_offset").distinct().count()
        == (per_type["OrderPlaced"])
    )
    qty = placed.selectExpr("sum(aggregate(lines, 0L, (acc, l) -> acc + l.qty))").first()[0]
    assert qty == sum(
        line["qty"] for t, d, _r in logged.values() if t == "OrderPlaced" for line in d["lines"]
    )

    # Dead letters: every undecodable record, at least once; none of them archived.
    dlq = launcher.options["archive"].dead_letter_topic
    assert sum(_log_end(kafka, [dlq]).values()) >= len(GARBAGE)
    plan = ArchivePlan(
        FoldTarget("archive", 1, redis_url, prefix, (("bootstrap.servers", kafka_bootstrap),), dlq),
        ArchiveProcessor("archive", root, (), DATES),
        EventCodec(),
    )
    _tables, problems = archive_status(plan)
    assert problems == []

    # replay --to-earliest --execute: the new generation's processor refuses before writing.
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")}
    spec = processor_spec("archive")
    replay_plan = plan_replay(spec, ToEarliest(), kafka, client, prefix, accept_dead_letters=True)
    assert replay_plan.ready, replay_plan.render()
    with pytest.raises(RebuildError, match=r"written by g1, not g2.*backfill"):
        run_rebuild(
            replay_plan,
            spec,
            kafka,
            RedisSettings(url=redis_url, key_prefix=prefix),
            state_dir=tmp_path,
            launcher=launcher,
        )
    assert registry.live() == 1
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")} == before
