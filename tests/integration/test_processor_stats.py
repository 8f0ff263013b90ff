"""Processing stats on a real Redis: counted once per batch, written by every sink kind."""

import dataclasses
import json
import time

from refold.contracts.processors import EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.stats import ProcessorStats, count_outcome
from refold.processors.runtime.batch_stats import BatchStatsRecorder, checkpoint_id
from refold.processors.runtime.dataframe import DataFrameSink
from refold.processors.runtime.envelope import FoldTarget


def _record(stats: ProcessorStats, batch_id: int, events: int, scope: str = "cp-1") -> bool:
    return stats.record_batch(
        1, batch_id, events, 0, 1, {"rejected": 1}, 120.0, None, checkpoint_id=scope, now_ms=5
    )


def test_a_batch_is_counted_once_per_checkpoint_and_batch_id(target: FoldTarget, redis_url):
    stats = ProcessorStats(redis_client(redis_url), target.layout)
    assert _record(stats, 0, 10)
    assert _record(stats, 1, 20)
    assert not _record(stats, 1, 20)  # run again after a restart
    assert not _record(stats, 0, 10)  # an older one
    read = stats.read(1)
    assert (read.batches, read.events, read.effects) == (2, 30, 2)
    assert read.dead_letters == {"rejected": 2}
    assert dict(read.duration_buckets)[250.0] == 2
    assert dict(read.duration_buckets)[100.0] == 0
    assert (read.last_batch_id, read.checkpoint_id) == (1, "cp-1")
    # A new checkpoint starts its batch ids at 0 again: its batches count.
    assert _record(stats, 0, 5, scope="cp-2")
    assert not _record(stats, 0, 5, scope="cp-2")
    read = stats.read(1)
    assert (read.batches, read.events, read.last_batch_id) == (3, 35, 0)
    assert stats.read_many([1, 2]) == {1: read, 2: stats.read(2)}
    assert stats.read(2).batches == 0
    stats.reset(1)
    assert stats.read(1).batches == 0


def test_the_recorder_scopes_batch_ids_by_the_checkpoint_and_reads_the_watermark(
    target: FoldTarget, redis_url, tmp_path
):
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-1"}))
    assert checkpoint_id(checkpoint) == "query-1"
    assert checkpoint_id(tmp_path / "missing") == ""
    timed = dataclasses.replace(target, event_time=EventTime(field="at", lateness_ms=1_000))
    client = redis_client(redis_url)
    client.hset(timed.keys.positions, mapping={"t/0": 3, "t/1": 4, "batch_id": 0})
    client.hset(timed.keys.clocks, mapping={"t/0": 50_000, "t/1": 40_000})
    recorder = BatchStatsRecorder(timed, checkpoint)
    # The records' counts come with the transaction that applied them ...
    with client.pipeline(transaction=True) as pipe:
        count_outcome(pipe, timed.keys.stats, events=3, duplicates=1, dead_letters={"late": 2})
        pipe.execute()
    # ... the batch's own stats from the driver, once per batch id.
    recorder.record(0, time.perf_counter())
    recorder.record(0, time.perf_counter())  # the same batch again
    read = ProcessorStats(client, timed.layout).read(timed.generation)
    assert (read.batches, read.events, read.duplicates) == (1, 3, 1)
    assert read.dead_letters == {"late": 2}
    assert read.watermark_ms == 39_000  # the clocks' minimum less the lateness
    assert read.checkpoint_id == "query-1"


def test_a_stats_failure_never_fails_the_batch(target: FoldTarget, caplog):
    unreachable = dataclasses.replace(target, redis_url="redis://127.0.0.1:1/0")
    BatchStatsRecorder(unreachable).record(3, time.perf_counter())
    assert "could not record the stats of batch 3" in caplog.text


class _Frame:
    """The one DataFrame method DataFrameSink calls (no Spark needed)."""

    def __init__(self, rows):
        self.rows = rows

    def collect(self):
        return self.rows


def test_the_dataframe_sink_counts_the_records_its_batches_read(
    target: FoldTarget, redis_url, tmp_path
):
    target = dataclasses.replace(target, processor="sales_native")
    client = redis_client(redis_url)
    client.hset(target.keys.positions, mapping={"orders/0": 0, "orders/1": 2})
    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    for batch_id, ends in {0: {"0": 5, "1": 6}, 1: {"0": 9, "1": 6}}.items():
        text = 'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"orders": ends})
        (checkpoint / "offsets" / str(batch_id)).write_text(text)
    sink = DataFrameSink(target, "per_minute", checkpoint)
    sink(_Frame([("EUR:1", '{"count": 1}')]), 0)
    sink(_Frame([("EUR:1", '{"count": 1}')]), 0)  # run again: applied before, not counted
    sink(_Frame([("EUR:1", '{"count": 2}')]), 1)
    read = ProcessorStats(client, target.layout).read(target.generation)
    assert (read.batches, read.events, read.last_batch_id) == (2, 5 + 4 + 4, 1)
