"""Pure planning logic of the Kafka source: rate limits, task coalescing, options."""

import pytest

from refold.processors.runtime.kafka_source import SourceOptions, cap_offsets, coalesce_ranges


def test_cap_shares_the_limit_in_proportion_to_the_backlog():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    end = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50}
    capped = cap_offsets(start, end, 500)
    assert sum(capped[tp] - start[tp] for tp in start) == 500
    assert capped[("t", 2)] == 50
    assert capped[("t", 0)] - 0 == pytest.approx(450, abs=1)
    assert capped[("t", 1)] - 100 == pytest.approx(50, abs=1)


def test_cap_is_a_no_op_under_the_limit_and_always_moves_forward():
    start = {("t", 0): 10, ("t", 1): 10}
    end = {("t", 0): 12, ("t", 1): 11}
    assert cap_offsets(start, end, 100) == end
    tiny = cap_offsets({("t", p): 0 for p in range(4)}, {("t", p): 5 for p in range(4)}, 2)
    assert sum(tiny.values()) == 2
    assert all(0 <= o <= 5 for o in tiny.values())


def test_cap_keeps_partitions_it_has_never_seen():
    assert cap_offsets({("t", 0): 0}, {("t", 0): 10, ("t", 1): 7}, 5) == {("t", 0): 5, ("t", 1): 7}


def test_coalescing_keeps_each_range_whole_and_balances_tasks():
    ranges = [("t", 0, 0, 100), ("t", 1, 0, 90), ("t", 2, 0, 10), ("t", 3, 0, 5)]
    groups = coalesce_ranges(ranges, 2)
    assert len(groups) == 2
    assert sorted(r for g in groups for r in g) == sorted(ranges)
    sizes = sorted(sum(e - s for _t, _p, s, e in g) for g in groups)
    assert sizes == [100, 105]
    assert coalesce_ranges(ranges, None) == [(r,) for r in ranges]
    assert coalesce_ranges(ranges, 10) == [(r,) for r in ranges]
    assert coalesce_ranges([], 2) == []


def test_options_follow_sparks_kafka_source():
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.security.protocol": "SSL",
            "subscribe": "a, b",
            "startingOffsets": "latest",
            "maxOffsetsPerTrigger": "10",
            "failOnDataLoss": "false",
            "maxTasks": "2",
        }
    )
    assert options.topics == ("a", "b")
    assert dict(options.kafka) == {"bootstrap.servers": "h:1", "security.protocol": "SSL"}
    assert (options.starting_offsets, options.max_offsets_per_trigger) == ("latest", 10)
    assert (options.fail_on_data_loss, options.max_tasks) == (False, 2)
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "a"})
    with pytest.raises(ValueError, match="subscribe"):
        SourceOptions.parse({"kafka.bootstrap.servers": "h:1"})


def test_small_batches_get_fewer_tasks():
    ranges = [("t", p, 0, 1_000) for p in range(8)]  # 8k records
    assert len(coalesce_ranges(ranges, 2, min_records_per_task=25_000)) == 1
    big = [("t", p, 0, 10_000) for p in range(8)]  # 80k records
    assert len(coalesce_ranges(big, 2, min_records_per_task=25_000)) == 2
    assert len(coalesce_ranges(big, None, min_records_per_task=25_000)) == 3
    grouped = coalesce_ranges(ranges, 2, min_records_per_task=25_000)[0]
    assert sorted(grouped) == sorted(ranges)  # every range kept whole, none lost


def test_min_records_per_task_option():
    opts = SourceOptions.parse({"kafka.bootstrap.servers": "b", "subscribe": "t"})
    assert opts.min_records_per_task == 25_000
    opts = SourceOptions.parse(
        {"kafka.bootstrap.servers": "b", "subscribe": "t", "minRecordsPerTask": "0"}
    )
    assert opts.min_records_per_task == 0
