"""The archive's writer, backfill and compaction against real Redis and a real broker, no Spark.

The task function (``archive_ranges``) is called as Spark would call it: a re-run batch writes
nothing new, a crashed attempt's files are removed by the next one (whatever its batch size),
positions going back (Redis restored from an older backup) cut the files past them, and
undecodable records are dead-lettered with reason and origin. Backfill and compaction leave the
same rows in fewer files. After each step the archive equals the log, event for event.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import position_field
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import PAGEVIEWS
from refold.processors.archive.projection import DATES
from refold.processors.errors import SinkConflictError
from refold.processors.fold.archive import ArchiveProcessor, Coverage
from refold.processors.runtime.archive import writer as archive_writer
from refold.processors.runtime.archive.maintenance import archive_status, backfill, compact
from refold.processors.runtime.archive.sink import ArchivePlan, archive_ranges
from refold.processors.runtime.archive.store import ArchiveOwnerError, ArchiveStore
from refold.processors.runtime.envelope import FoldTarget
from refold.services.producer.publisher import EventPublisher
from tests.support.archive import archive_rows, assert_archive_equals_log
from tests.support.dead_letters import dlq_letters

DAY_MS = 86_400_000
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAYS = ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04")


@dataclasses.dataclass
class World:
    plan: ArchivePlan
    topics: list[str]
    kafka: KafkaSettings
    bootstrap: str
    client: redis.Redis

    @property
    def root(self) -> Path:
        return self.plan.archive.root

    @property
    def registry(self) -> GenerationRegistry:
        target = self.plan.target
        return GenerationRegistry.of(self.client, target.processor, target.key_prefix)

    def ends(self) -> dict[tuple[str, int], int]:
        offsets = LogOffsets(self.kafka.as_librdkafka())
        try:
            tps = [(t, p) for t in self.topics for p in offsets.partitions(t)]
            return offsets.end_offsets(tps)
        finally:
            offsets.close()

    def applied(self) -> dict[tuple[str, int], int]:
        return self.registry.positions(1)[0]

    def batches(self, *fractions: float) -> list[tuple[tuple[str, int, int, int], ...]]:
        """The log split into batches ending at these fractions of each partition's end."""
        ends = self.ends()
        out, start = [], dict.fromkeys(ends, 0)
        for fraction in (*fractions, 1.0):
            stop = {tp: int(e * fraction) for tp, e in ends.items()}
            out.append(tuple((t, p, start[t, p], stop[t, p]) for (t, p) in sorted(ends)))
            start = stop
        return out

    def equals_log(self, upto: dict[tuple[str, int], int] | None = None) -> int:
        return assert_archive_equals_log(self.root, self.bootstrap, self.topics, upto, DATES)

    def files(self) -> dict[Path, float]:
        return {p: p.stat().st_mtime_ns for p in self.root.rglob("*.parquet")}


def _events(orders: int, seed: int) -> list[tuple[str, dict]]:
    """Orders and page views whose event times spread over four days."""
    rng = random.Random(seed)
    out: list[tuple[str, dict]] = []
    for n in range(orders):
        at = BASE_MS + rng.randrange(4 * DAY_MS)
        order = f"ord-{seed}-{n}"
        out.append(
            (
                "OrderPlaced",
                {
                    "event_id": f"{order}-p",
                    "order_id": order,
                    "customer_id": f"cus-{n % 7}",
                    "lines": [{"sku": f"sku-{n % 5}", "qty": 1 + n % 3, "unit_price_minor": 250}],
                    "currency": "EUR",
                    "placed_at": at,
                    "channel": "web",
                    "coupon_code": None if n % 4 else "WELCOME",
                },
            )
        )
        out.append(
            (
                "OrderPaid",
                {
                    "event_id": f"{order}-x",
                    "order_id": order,
                    "amount_minor": 250 * (1 + n % 3),
                    "currency": "EUR",
                    "payment_method": ("CARD", "WALLET", "BANK_TRANSFER")[n % 3],
                    "paid_at": at + rng.randrange(DAY_MS // 2),  # some are paid the next day
                },
            )
        )
        out.append(
            (
                "PageViewed",
                {
                    "event_id": f"{order}-v",
                    "session_id": f"ses-{n % 11}",
                    "visitor_id": f"vis-{n % 13}",
                    "customer_id": None,
                    "url": f"https://shop.example/p/{n}",
                    "path": f"/p/{n}",
                    "page_type": "PRODUCT",
                    "sku": f"sku-{n % 5}",
                    "referrer": None,
                    "device": "MOBILE",
                    "occurred_at": at - 60_000,
                },
            )
        )
    return out


@pytest.fixture
def world(kafka_bootstrap, redis_url, make_topic, unique, tmp_path) -> World:
    orders = make_topic(partitions=4, prefix="orders")
    pageviews = make_topic(partitions=2, prefix="pageviews")
    dlq = make_topic(partitions=1, prefix="dlq")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    target = FoldTarget(
        "archive",
        1,
        redis_url,
        f"test-{unique}",
        (("bootstrap.servers", kafka_bootstrap),),
        dlq,
    )
    archive = ArchiveProcessor(
        "archive", tmp_path / "archive", ("OrderPlaced", "OrderPaid", "PageViewed"), DATES
    )
    publisher = EventPublisher(
        kafka,
        topics=[
            dataclasses.replace(ORDERS, name=orders, partitions=4),
            dataclasses.replace(PAGEVIEWS, name=pageviews, partitions=2),
        ],
    )
    publisher.emit_many(_events(120, seed=5))
    publisher.close()
    client = redis_client(redis_url)
    world = World(
        ArchivePlan(target, archive, EventCodec()),
        [orders, pageviews],
        kafka,
        kafka_bootstrap,
        client,
    )
    # As the runner does before a generation's first batch: its starting positions.
    world.registry.create({}, live=True)
    world.registry.set_positions(1, {position_field(t, p): 0 for t, p in world.ends()})
    return world


def test_each_batch_is_archived_once_and_a_re_run_batch_writes_nothing(world):
    first, second = world.batches(0.5)
    outcome = archive_ranges(world.plan, first, batch_id=0)
    assert outcome.archived == outcome.records == sum(e - s for _t, _p, s, e in first)
    assert world.applied() == {(t, p): e for t, p, _s, e in first}
    assert world.equals_log(world.applied()) == outcome.archived
    files = world.files()
    # Several dates per partition: one file per (type, date) of each partition range.
    assert len({p.parent.name for p in files}) >= len(DAYS)

    again = archive_ranges(world.plan, first, batch_id=0)  # Spark re-runs the batch

    assert (again.archived, again.skipped, again.files) == (0, outcome.records, 0)
    assert world.files() == files  # not even rewritten
    archive_ranges(world.plan, second, batch_id=1)
    assert world.applied() == world.ends()
    assert world.equals_log() == sum(world.ends().values())
    assert world.client.hget(world.plan.target.keys.positions, "batch_id") == b"1"


def test_a_crashed_attempt_leaves_files_that_the_next_attempt_removes(world, monkeypatch):
    big, _rest = world.batches(0.8)
    small, _ = world.batches(0.3)

    def crash(self, moves, batch_id, outcome, letters):
        msg = "killed between the files and the commit"
        raise OSError(msg)

    with monkeypatch.context() as patch:
        patch.setattr(archive_writer.ArchiveWriter, "commit", crash)
        with pytest.raises(OSError, match="killed"):
            archive_ranges(world.plan, big, batch_id=0)
    assert world.applied() == dict.fromkeys(world.ends(), 0)  # nothing committed
    orphans = set(world.files())
    assert orphans  # written, never committed

    # The restarted query plans another batch (say, another maxOffsetsPerTrigger).
    archive_ranges(world.plan, small, batch_id=0)

    small_ends = {(t, p): e for t, p, _s, e in small}
    assert world.applied() == small_ends
    for path in world.files():  # no file of the crashed attempt is left
        cov = Coverage.parse(path.name)
        assert cov is not None
        assert (cov.start, cov.end) == (0, small_ends[cov.topic, cov.partition]), path
    assert world.equals_log(small_ends) > 0
    rest = tuple((t, p, small_ends[t, p], e) for (t, p), e in sorted(world.ends().items()))
    archive_ranges(world.plan, rest, batch_id=1)
    assert world.equals_log() == sum(world.ends().values())


def test_positions_gone_back_cut_the_files_past_them(world):
    for batch_id, batch in enumerate(world.batches(0.25, 0.5, 0.75)):
        archive_ranges(world.plan, batch, batch_id)
    compact(world.plan)  # one file per (type, date, partition), covering [0, end)
    ends = world.ends()
    assert world.equals_log() == sum(ends.values())

    # Redis restored from a backup taken at mid-log: its positions are behind the files.
    middle = {tp: e // 2 for tp, e in ends.items()}
    world.registry.set_positions(1, {position_field(t, p): o for (t, p), o in middle.items()})
    archive_ranges(
        world.plan, tuple((t, p, middle[t, p], e) for (t, p), e in sorted(ends.items())), 9
    )

    assert world.equals_log() == sum(ends.values())
    _tables, problems = archive_status(world.plan)
    assert problems == []


def test_undecodable_records_are_dead_lettered_with_reason_and_origin(world):
    orders = world.topics[0]
    raw = Producer({"bootstrap.servers": world.bootstrap})
    garbage = [b"not avro", b"\xc3\x01" + b"\x00" * 8 + b"unknown", b""]
    for n, value in enumerate(garbage):
        raw.produce(orders, value, b"key", partition=n % 4)
    raw.flush(30)
    (batch,) = world.batches()

    outcome = archive_ranges(world.plan, batch, batch_id=0)

    assert outcome.undecodable == len(garbage)
    assert world.applied() == world.ends()
    assert world.equals_log() == sum(world.ends().values()) - len(garbage)
    consumer = Consumer(
        {"bootstrap.servers": world.bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(world.plan.target.dlq_topic, 0, 0)])
    letters = consumer.consume(len(garbage), timeout=10)
    consumer.close()
    assert len(letters) == len(garbage)
    by_value = {m.value() or b"": dict(m.headers()) for m in letters}
    assert by_value[b"not avro"]["refold.reason"] == b"bad-magic"
    assert by_value[garbage[1]]["refold.reason"] == b"unknown-fingerprint"
    for headers in by_value.values():
        assert headers["refold.origin.topic"] == orders.encode()
        assert headers["refold.processor"] == b"archive"
        assert int(headers["refold.origin.offset"]) >= 0


def test_a_rebuild_does_not_send_the_live_generations_dead_letters_again(world, tmp_path):
    """Dead letters once (issue 22 item 3) in the archive engine."""
    orders = world.topics[0]
    raw = Producer({"bootstrap.servers": world.bootstrap})
    bad: list[tuple[int, int]] = []
    for _round in range(2):  # a bad record on each partition of orders, twice
        for partition in range(4):
            raw.produce(
                orders,
                b"not avro",
                b"key",
                partition=partition,
                on_delivery=lambda _e, m: bad.append((m.partition(), m.offset())),
            )
        raw.flush(30)
    ends = world.ends()
    # The live generation's batch ends past each partition's first bad record.
    firsts = {p: min(o for q, o in bad if q == p) for p in range(4)}
    first = tuple(
        (t, p, 0, firsts[p] + 1 if t == orders else e) for (t, p), e in sorted(ends.items())
    )
    second = tuple((t, p, firsts[p] + 1, e) for (t, p), e in sorted(ends.items()) if t == orders)
    target = world.plan.target

    archive_ranges(world.plan, first, batch_id=0)  # live (g1): the first half
    by_live = dlq_letters(world.bootstrap, target.dlq_topic)
    assert len(by_live) == 4

    # A rebuild (g2, its own root) of the whole log: only the second half's letters are sent.
    assert world.registry.create({"replay_of": 1}) == 2
    world.registry.set_positions(2, {position_field(t, p): 0 for t, p in world.ends()})
    rebuild = dataclasses.replace(
        world.plan,
        target=dataclasses.replace(target, generation=2),
        archive=dataclasses.replace(world.plan.archive, root=tmp_path / "rebuilt"),
    )
    rebuild.store.claim(target.processor, target.key_prefix, 2)
    (everything,) = world.batches()
    outcome = archive_ranges(rebuild, everything, batch_id=0)
    after = dlq_letters(world.bootstrap, target.dlq_topic)
    new = after[len(by_live) :]
    assert (outcome.undecodable, outcome.suppressed_letters) == (8, 4)
    assert len(new) == 4
    assert {(p, o) for p, o, _r, _g in new}.isdisjoint({(p, o) for p, o, _r, _g in by_live})
    assert all(g == 2 for *_rest, g in new)
    # Its index, written with its positions, holds all eight it decided.
    index = world.client.hgetall(rebuild.target.keys.dead_letters)
    assert sorted(index.values()) == [b"bad-magic"] * 8
    assert {k.decode().rpartition("@")[0] for k in index} == {f"{orders}/{p}" for p in range(4)}
    # The rest of the live generation: the rebuild sent those letters already (the dl:sent
    # ledger holds them), so the live generation does not send them again.
    archive_ranges(world.plan, second, batch_id=1)
    assert len(dlq_letters(world.bootstrap, target.dlq_topic)) == len(after)


def test_backfill_and_compaction_keep_the_same_rows_in_fewer_files(world, monkeypatch):
    for batch_id, batch in enumerate(world.batches(0.2, 0.4, 0.6, 0.8)):
        archive_ranges(world.plan, batch, batch_id)
    before = archive_rows(world.root)
    small = len(world.files())

    filled = backfill(world.plan, world.topics, DAYS[1], DAYS[2])

    assert filled.files_removed > filled.files_written > 0
    assert archive_rows(world.root) == before
    assert world.equals_log() == len(before)
    ends = world.ends()
    for path in world.files():
        cov = Coverage.parse(path.name)
        date = path.parent.name.removeprefix("event_date=")
        if date in DAYS[1:3]:  # one file per (type, date, partition) covering [0, end)
            assert (cov.start, cov.end) == (0, ends[cov.topic, cov.partition]), path
    filled_again = backfill(world.plan, world.topics, DAYS[1], DAYS[2])  # idempotent
    assert filled_again.files_written == filled.files_written
    assert archive_rows(world.root) == before

    # A compaction killed between writing the merged files and deleting the small ones ...
    with monkeypatch.context() as patch:
        patch.setattr(ArchiveStore, "apply_rule", lambda self, directory: [])
        compact(world.plan)
    _tables, problems = archive_status(world.plan)
    assert any("lie within another" in p for p in problems)
    with pytest.raises(AssertionError, match="twice"):
        archive_rows(world.root)
    # Readers that list the current files see every event once even now.
    store = world.plan.store
    listed = [path for table in store.tables() for path in store.current_files(table)]
    keys = [
        (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"])
        for path in listed
        for r in pq.read_table(
            path, columns=["kafka_topic", "kafka_partition", "kafka_offset"]
        ).to_pylist()
    ]
    assert sorted(keys) == sorted(before)
    # ... is repaired by the next one (the redundancy rule).
    merged = compact(world.plan)
    assert merged.files_removed > 0
    tables, problems = archive_status(world.plan)
    assert problems == []
    assert archive_rows(world.root) == before
    assert sum(t.rows for t in tables.values()) == len(before)
    assert sum(t.files for t in tables.values()) < small
    per_group = {
        (p.parent, Coverage.parse(p.name).topic, Coverage.parse(p.name).partition)
        for p in world.files()
    }
    assert len(per_group) == len(world.files())  # one file per (type, date, partition)

    # New batches after the maintenance go on from the applied positions.
    publisher = EventPublisher(
        world.kafka,
        topics=[
            dataclasses.replace(ORDERS, name=world.topics[0], partitions=4),
            dataclasses.replace(PAGEVIEWS, name=world.topics[1], partitions=2),
        ],
    )
    publisher.emit_many(_events(30, seed=6))
    publisher.close()
    applied = world.applied()
    later = tuple((t, p, applied[t, p], e) for (t, p), e in sorted(world.ends().items()))
    archive_ranges(world.plan, later, batch_id=9)
    assert world.equals_log() == sum(world.ends().values())


def test_an_archive_belongs_to_one_generation_and_one_key_prefix(world):
    store = world.plan.store
    store.claim("archive", "test-x", 1)
    store.claim("archive", "test-x", 1)  # the same owner: fine
    with pytest.raises(ArchiveOwnerError, match=r"written by g1, not g2.*backfill"):
        store.claim("archive", "test-x", 2)
    with pytest.raises(ArchiveOwnerError, match="own root"):
        store.claim("archive", "test-y", 1)


def test_a_second_writer_of_the_generation_is_refused(world):
    first, _second = world.batches(0.5)
    t, p, _s, _e = first[0]
    # Another process moved one position between this task's read and its commit.
    writer = archive_writer.writer_of(world.plan)
    with pytest.raises(SinkConflictError, match="another process"):
        writer.commit({position_field(t, p): (5, 9)}, 0)
