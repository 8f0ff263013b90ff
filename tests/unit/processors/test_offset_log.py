"""Spark's checkpoint offsets log: where a micro-batch starts and ends (pure file parsing)."""

import pytest

from refold.processors.errors import ProcessorError
from refold.processors.runtime.offset_log import batch_ranges, batch_start_offsets, parse_offset_log

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
