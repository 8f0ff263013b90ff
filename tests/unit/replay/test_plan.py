import json
from datetime import UTC, datetime, timedelta

import pytest

from refold.replay.errors import PlanError
from refold.replay.plan import (
    ByDuration,
    FromFile,
    FromOffset,
    PlanCheck,
    SeedPoint,
    ShiftBy,
    ToCurrent,
    ToDatetime,
    ToEarliest,
    ToLatest,
    build_plan,
    parse_datetime,
    parse_duration,
    parse_offsets_csv,
    parse_scope,
)

BOUNDS = {("orders", 0): (0, 100), ("orders", 1): (10, 50), ("other", 0): (0, 5)}
CURRENT = {("orders", 0): 100, ("orders", 1): 40, ("other", 0): 5}


def test_to_earliest_targets_every_log_start():
    plan = build_plan("p", ToEarliest(), BOUNDS, CURRENT, 1)
    assert [(r.topic, r.partition, r.target, r.events) for r in plan.partitions] == [
        ("orders", 0, 0, 100),
        ("orders", 1, 10, 40),
        ("other", 0, 0, 5),
    ]
    assert plan.total_events == 145
    assert not plan.needs_state
    assert json.loads(plan.starting_offsets()) == {
        "orders": {"0": 0, "1": 10},
        "other": {"0": 0},
    }


def test_from_offset_clamps_down_like_kafka_and_needs_the_state_as_of_its_targets():
    plan = build_plan("p", FromOffset(60), BOUNDS, CURRENT, 1)
    rows = {(r.topic, r.partition): r for r in plan.partitions}
    assert rows["orders", 0].target == 60
    assert rows["orders", 1].target == 50
    assert "clamped down" in rows["orders", 1].note
    assert rows["other", 0].target == 5
    assert plan.needs_state


def test_a_seeded_plan_folds_from_the_snapshot_positions():
    plan = build_plan("p", FromOffset(60), BOUNDS, CURRENT, 1)
    seed = SeedPoint("g1/s2", {("orders", 0): 55, ("orders", 1): 30}, 0.0)
    seeded = plan.with_seed(seed)
    rows = {(r.topic, r.partition): r for r in seeded.partitions}
    assert (rows["orders", 0].target, rows["orders", 0].begin, rows["orders", 0].events) == (
        60,
        55,
        45,
    )
    assert rows["other", 0].begin == 0  # not in the snapshot: nothing applied there yet
    assert json.loads(seeded.starting_offsets()) == {
        "orders": {"0": 55, "1": 30},
        "other": {"0": 0},
    }
    assert seeded.export_csv().splitlines()[0] == "orders,0,60"  # the targets, as asked
    assert "seeded from snapshot g1/s2" in seeded.render()


def test_failed_checks_make_a_plan_not_ready_and_say_what_to_do():
    plan = build_plan("p", FromOffset(60), BOUNDS, CURRENT, 1)
    assert plan.ready  # no checks yet
    checked = plan.with_checks(
        (PlanCheck("retention", True, "all retained"), PlanCheck("state", False, "no", "snap"))
    )
    assert not checked.ready
    text = checked.render()
    assert "FAIL state" in text
    assert "what to do: snap" in text
    assert checked.as_dict()["ready"] is False


def test_a_target_below_the_log_start_is_refused_unless_data_loss_is_allowed():
    with pytest.raises(PlanError, match=r"orders/1: 3 < log start 10.*--allow-data-loss"):
        build_plan("p", FromOffset(3), BOUNDS, CURRENT, 1)
    low = build_plan("p", FromOffset(3), BOUNDS, CURRENT, 1, allow_data_loss=True)
    row = {(r.topic, r.partition): r for r in low.partitions}["orders", 1]
    assert (row.target, "gone" in row.note) == (10, True)


def test_every_reset_spec_resolves_per_partition():
    def targets(spec, **kw):
        plan = build_plan("p", spec, BOUNDS, CURRENT, 1, **kw)
        return {(r.topic, r.partition): r.target for r in plan.partitions}

    assert targets(ToLatest()) == {("orders", 0): 100, ("orders", 1): 50, ("other", 0): 5}
    assert targets(ToCurrent()) == {("orders", 0): 100, ("orders", 1): 40, ("other", 0): 5}
    assert targets(ShiftBy(-20), allow_data_loss=True) == {
        ("orders", 0): 80,
        ("orders", 1): 20,
        ("other", 0): 0,
    }
    assert targets(ShiftBy(+5)) == {("orders", 0): 100, ("orders", 1): 45, ("other", 0): 5}
    at = {("orders", 0): 33, ("orders", 1): 12, ("other", 0): 5}
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert targets(ToDatetime(when), at_time=at) == at
    assert targets(ByDuration(timedelta(hours=1), when), at_time=at) == at
    from_file = FromFile({("orders", 1): 15})
    plan = build_plan("p", from_file, BOUNDS, CURRENT, 1)
    rows = {(r.topic, r.partition): r for r in plan.partitions}
    assert rows["orders", 1].target == 15
    assert rows["orders", 0].target == 0
    assert "not in the offsets file" in rows["orders", 0].note


def test_shift_below_the_start_needs_data_loss_permission():
    with pytest.raises(PlanError, match="log start"):
        build_plan("p", ShiftBy(-35), BOUNDS, CURRENT, 1)


def test_from_file_naming_foreign_partitions_is_refused():
    with pytest.raises(PlanError, match="does not read: orders/9"):
        build_plan("p", FromFile({("orders", 9): 1}), BOUNDS, CURRENT, 1)


def test_export_round_trips_through_the_csv_reader():
    plan = build_plan("p", ToCurrent(), BOUNDS, CURRENT, 1)
    text = plan.export_csv()
    assert text.splitlines()[0] == "orders,0,100"
    again = build_plan("p", FromFile(parse_offsets_csv(text)), BOUNDS, CURRENT, 1)
    assert again.starting_offsets() == plan.starting_offsets()


def test_csv_reader_accepts_kafkas_forms_and_names_bad_lines():
    assert parse_offsets_csv("topic,partition,offset\nt,0,5\n\n") == {("t", 0): 5}
    assert parse_offsets_csv("group,t,1,7\n") == {("t", 1): 7}
    with pytest.raises(PlanError, match="line 2"):
        parse_offsets_csv("t,0,5\nt,zero,5\n")
    with pytest.raises(PlanError, match="no topic,partition,offset"):
        parse_offsets_csv("\n")


def test_naive_datetimes_and_bad_durations_are_refused_clearly():
    assert parse_datetime("2026-11-22T10:00:00Z") == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert parse_datetime("2026-11-22T11:00:00+01:00") == datetime(2026, 11, 22, 10, tzinfo=UTC)
    with pytest.raises(PlanError, match="no time zone"):
        parse_datetime("2026-11-22T10:00:00")
    with pytest.raises(PlanError, match="not ISO-8601"):
        parse_datetime("yesterday")
    assert parse_duration("PT30M") == timedelta(minutes=30)
    assert parse_duration("P1DT2H3M4S") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    for bad in ("PT", "P", "30M", "PT0S"):
        with pytest.raises(PlanError):
            parse_duration(bad)


def test_scope_limits_the_spec_and_the_rest_starts_from_earliest():
    scope = parse_scope(["orders:1"])
    plan = build_plan("p", FromOffset(20), BOUNDS, CURRENT, 1, scope)
    targets = {(r.topic, r.partition): (r.target, r.note) for r in plan.partitions}
    assert targets["orders", 1] == (20, "")
    assert targets["orders", 0][0] == 0
    assert "outside --topic scope" in targets["orders", 0][1]


def test_parse_scope_forms():
    assert parse_scope(None) is None
    assert parse_scope(["a", "b:0,2", "b:3"]) == {"a": None, "b": {0, 2, 3}}
    assert parse_scope(["a", "a:1"]) == {"a": None}
    with pytest.raises(PlanError, match="topic:0,1,2"):
        parse_scope(["a:x"])


def test_unknown_topic_or_partition_is_refused_with_what_exists():
    with pytest.raises(PlanError, match="reads orders, other"):
        build_plan("p", ToEarliest(), BOUNDS, CURRENT, 1, {"nope": None})
    with pytest.raises(PlanError, match="no partition 7"):
        build_plan("p", ToEarliest(), BOUNDS, CURRENT, 1, {"orders": {7}})


def test_render_shows_every_partition_and_the_total():
    text = build_plan("order_state", ToEarliest(), BOUNDS, {}, None).render()
    assert "live generation: none" in text
    assert text.count("\n") == 5
    assert "145" in text.splitlines()[-1]


def test_below_the_log_start_the_archive_serves_what_it_covers_and_a_gap_is_refused():
    from refold.contracts.archive_coverage import CoveredRanges
    from refold.replay.validate import retention_check

    bounds = {("orders", 0): (600, 1000), ("orders", 1): (400, 900)}
    archived = {
        ("orders", 0): CoveredRanges(((0, 700),)),
        ("orders", 1): CoveredRanges(((0, 100), (150, 500))),
    }
    plan = build_plan("p", FromOffset(200), bounds, {}, None, archived=archived)
    rows = {(r.topic, r.partition): r for r in plan.partitions}
    assert (rows["orders", 0].target, rows["orders", 0].from_archive) == (200, 400)
    assert "200..599 from the archive, then the log" in rows["orders", 0].note
    assert rows["orders", 0].events == 800  # archive part and log part
    assert not plan.needs_state
    assert retention_check(plan).ok
    assert "600 records below the log start come from the archive" in retention_check(plan).detail
    assert "ARCHIVE" in plan.render()
    assert "0-700" in plan.render()

    # All of history: each partition from the first offset the archive holds without a gap.
    earliest = build_plan("p", ToEarliest(), bounds, {}, None, archived=archived)
    assert [r.target for r in earliest.partitions] == [0, 150]

    # The archive lacks 100..149 of partition 1: refused, naming them.
    with pytest.raises(
        PlanError, match=r"orders/1: 50 < log start 400 \(the archive lacks 100\.\.149\)"
    ):
        build_plan("p", FromOffset(50), bounds, {}, None, archived=archived)
    clamped = build_plan(
        "p", FromOffset(50), bounds, {}, None, archived=archived, allow_data_loss=True
    )
    assert [r.target for r in clamped.partitions] == [50, 400]
