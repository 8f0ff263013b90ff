"""Spark's checkpoint offsets log: where a micro-batch starts and ends (pure file parsing)."""

import pytest

from refold.processors.errors import ProcessorError
from refold.processors.runtime.kafka_ranges import SourceOptions, TaskPlan
from refold.processors.runtime.offset_log import (
    batch_ranges,
    batch_start_offsets,
    parse_offset_log,
    planned_ranges,
)

_META = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def test_the_offsets_log_gives_the_batch_end_as_position_fields():
    text = (
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
        '{"orders": {"0": 389, "1": 426}, "more": {"10": 3}}\n'
    )
    assert parse_offset_log(text) == {"orders/0": 389, "orders/1": 426, "more/10": 3}
    for broken in ("", "v1\n{}\n", "v1\n{}\nnot json", "v1\n{}\n[1]"):
        with pytest.raises(ProcessorError):
            parse_offset_log(broken)


def _checkpoint(tmp_path, initial: str, *ends: str):
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text(initial)
    (tmp_path / "offsets").mkdir()
    for batch_id, end in enumerate(ends):
        (tmp_path / "offsets" / str(batch_id)).write_text(f"v1\n{_META}\n{end}\n")
    return tmp_path


def test_a_batch_starts_at_the_source_s_initial_offsets_then_at_the_previous_end(tmp_path):
    checkpoint = _checkpoint(
        tmp_path,
        '\x00v1\n{"orders":{"0":5,"1":0}}',  # what Spark's Kafka source writes
        '{"orders":{"0":9,"1":4}}',
        '{"orders":{"0":12,"1":4,"2":7}}',  # partition 2 is new in batch 1
    )
    assert batch_start_offsets(checkpoint, 0) == {"orders/0": 5, "orders/1": 0}
    assert batch_ranges(checkpoint, 0) == {"orders/0": (5, 9), "orders/1": (0, 4)}
    assert batch_ranges(checkpoint, 1) == {"orders/0": (9, 12), "orders/1": (4, 4)}


def test_a_checkpoint_without_the_initial_offsets_is_an_error(tmp_path):
    with pytest.raises(ProcessorError, match="initial offsets"):
        batch_start_offsets(tmp_path, 0)
    checkpoint = _checkpoint(tmp_path, "not offsets")
    with pytest.raises(ProcessorError, match="initial offsets"):
        batch_start_offsets(checkpoint, 0)


def test_the_ranges_refolds_source_planned_are_read_back_from_the_log(tmp_path):
    checkpoint = _checkpoint(
        tmp_path,
        "refold's sources write no initial offsets; this file is not read",
        '{"orders":{"0":9,"1":4}}',
        '{"orders":{"0":12,"1":4,"2":7},"more":{"0":3}}',  # partitions new in batch 1
    )
    # Batch 0 starts where the source's initial offsets were: the log does not say.
    assert planned_ranges(checkpoint, 0) is None
    # Empty ranges are left out, new partitions start at 0: as the source's partitions().
    assert planned_ranges(checkpoint, 1) == [
        ("more", 0, 0, 3),
        ("orders", 0, 9, 12),
        ("orders", 2, 0, 7),
    ]
    with pytest.raises(FileNotFoundError):
        planned_ranges(checkpoint, 2)  # not written yet: Spark writes it before the batch
    (tmp_path / "offsets" / "0").unlink()
    assert planned_ranges(checkpoint, 1) is None  # the previous entry is gone
    (tmp_path / "offsets" / "2").write_text("v1\n{}\nnot offsets\n")
    with pytest.raises(ProcessorError, match="offsets log"):
        planned_ranges(checkpoint, 2)


def test_a_planned_batch_is_split_into_tasks_as_the_source_splits_it():
    ranges = [("orders", p, 0, 20_000) for p in range(4)]
    # 80k records: 3 tasks of at least 25k records by default, the largest first.
    assert TaskPlan().groups(ranges) == [
        (ranges[0], ranges[3]),
        (ranges[1],),
        (ranges[2],),
    ]
    assert TaskPlan(max_tasks=2).groups(ranges) == [(ranges[0], ranges[2]), (ranges[1], ranges[3])]
    options = SourceOptions.parse(
        {
            "subscribe": "orders",
            "kafka.bootstrap.servers": "k:9092",
            "maxTasks": "2",
        }
    )
    assert options.tasks == TaskPlan(max_tasks=2)
