import json

import pytest

from replay.errors import PlanError
from replay.plan import FromOffset, ToEarliest, build_plan, parse_scope

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
    assert plan.warnings == ()
    assert json.loads(plan.starting_offsets()) == {
        "orders": {"0": 0, "1": 10},
        "other": {"0": 0},
    }


def test_from_offset_clamps_like_kafka_and_warns_that_the_generation_starts_empty():
    plan = build_plan("p", FromOffset(60), BOUNDS, CURRENT, 1)
    rows = {(r.topic, r.partition): r for r in plan.partitions}
    assert rows["orders", 0].target == 60
    assert rows["orders", 1].target == 50
    assert "clamped down" in rows["orders", 1].note
    assert rows["other", 0].target == 5
    low = build_plan("p", FromOffset(3), BOUNDS, CURRENT, 1)
    assert {(r.topic, r.partition): r.target for r in low.partitions}["orders", 1] == 10
    assert any("starts empty" in w for w in plan.warnings)


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
