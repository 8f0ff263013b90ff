"""State as of a moment (``replay --until``): parsing, bounds, checks and the bounded plan."""

import json
from datetime import UTC, datetime

import pytest

from refold.contracts.processors import process_argv
from refold.processors.runtime.kafka_source import KafkaStreamReader, SourceOptions
from refold.replay.api import PlanRequest
from refold.replay.arguments import parse_args, reset_spec
from refold.replay.as_of import (
    LogTimes,
    UntilOffsets,
    UntilTime,
    bound_plan,
    check_moment,
    ending_offsets,
    parse_until,
    parse_until_offsets,
)
from refold.replay.errors import PlanError
from refold.replay.plan import FromOffset, ToEarliest, build_plan

BOUNDS = {("orders", 0): (0, 100), ("orders", 1): (10, 50)}
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
FIRST_MS = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
LAST_MS = int(datetime(2026, 12, 7, 11, 0, tzinfo=UTC).timestamp() * 1000)


def test_until_offsets_read_sparks_json_and_csv():
    assert parse_until_offsets('{"orders":{"0":40,"1":20}}') == {
        ("orders", 0): 40,
        ("orders", 1): 20,
    }
    assert parse_until_offsets("orders,0,40;orders,1,20") == {("orders", 0): 40, ("orders", 1): 20}
    assert parse_until_offsets("topic,partition,offset\norders,0,40\n") == {("orders", 0): 40}
    with pytest.raises(PlanError, match="not offsets JSON"):
        parse_until_offsets('{"orders": 3')
    with pytest.raises(PlanError, match=">= 0"):
        parse_until_offsets("orders,0,-1")


def test_until_takes_an_iso_time_with_a_zone():
    until = parse_until("2026-12-03T12:00:00+01:00", None)
    assert isinstance(until, UntilTime)
    assert until.moment == "2026-12-03T12:00:00+01:00"
    # The bound is the first record *after* the moment: Kafka's lookup of moment + 1 ms.
    assert until.after_ms == int(until.when.timestamp() * 1000) + 1
    assert parse_until(None, None) is None
    with pytest.raises(PlanError, match="no time zone"):
        parse_until("2026-12-03T12:00:00", None)


def test_a_moment_in_the_future_or_before_the_first_event_is_refused_naming_the_log():
    times = LogTimes(FIRST_MS, LAST_MS)
    check_moment(UntilTime(datetime(2026, 12, 3, tzinfo=UTC)), times, NOW)  # fine
    check_moment(UntilTime(datetime(2026, 12, 1, tzinfo=UTC)), times, NOW)  # the first event
    with pytest.raises(PlanError) as future:
        check_moment(UntilTime(datetime(2026, 12, 8, tzinfo=UTC)), times, NOW)
    assert "2026-12-08T00:00:00+00:00 is in the future" in str(future.value)
    assert "from 2026-12-01T00:00:00.000+00:00 to 2026-12-07T11:00:00.000+00:00" in str(
        future.value
    )
    with pytest.raises(PlanError) as early:
        check_moment(UntilTime(datetime(2026, 11, 30, tzinfo=UTC)), times, NOW)
    assert "2026-11-30T00:00:00+00:00 is before the first event" in str(early.value)
    assert "2026-12-01T00:00:00.000+00:00" in str(early.value)
    with pytest.raises(PlanError, match="the log has no records"):
        check_moment(UntilTime(datetime(2026, 12, 3, tzinfo=UTC)), LogTimes(None, None), NOW)


def test_ending_offsets_of_a_time_are_the_lookups_and_of_offsets_name_every_partition():
    until = UntilTime(datetime(2026, 12, 3, tzinfo=UTC))
    assert ending_offsets(until, BOUNDS, {("orders", 0): 42, ("orders", 1): 50}) == {
        ("orders", 0): 42,
        ("orders", 1): 50,
    }
    named = UntilOffsets({("orders", 0): 40, ("orders", 1): 20})
    assert ending_offsets(named, BOUNDS) == {("orders", 0): 40, ("orders", 1): 20}
    with pytest.raises(PlanError, match=r"misses partitions .*orders/1"):
        ending_offsets(UntilOffsets({("orders", 0): 40}), BOUNDS)
    with pytest.raises(PlanError, match="does not read: other/0"):
        ending_offsets(UntilOffsets({**named.offsets, ("other", 0): 1}), BOUNDS)
    with pytest.raises(PlanError, match=r"past the log end: orders/1=60 > 50"):
        ending_offsets(UntilOffsets({("orders", 0): 40, ("orders", 1): 60}), BOUNDS)


def test_a_bounded_plan_folds_from_its_targets_up_to_its_bounds():
    until = UntilOffsets({("orders", 0): 40, ("orders", 1): 20})
    plan = bound_plan(build_plan("p", ToEarliest(), BOUNDS, {}, 1), until, until.offsets)
    assert [(r.begin, r.end, r.events) for r in plan.partitions] == [(0, 40, 40), (10, 20, 10)]
    assert plan.total_events == 50
    assert plan.until == "offsets"
    assert json.loads(plan.ending_offsets() or "") == {"orders": {"0": 40, "1": 20}}
    assert json.loads(plan.starting_offsets()) == {"orders": {"0": 0, "1": 10}}
    assert plan.as_dict()["ending_offsets"] == {"orders": {"0": 40, "1": 20}}
    assert "stops before 40" in plan.render()
    assert "kept beside the live one (status as_of), without a flip" in plan.render()
    unbounded = build_plan("p", ToEarliest(), BOUNDS, {}, 1)
    assert unbounded.ending_offsets() is None
    assert unbounded.partitions[0].events == 100


def test_a_bound_before_the_start_is_refused():
    plan = build_plan("p", FromOffset(30), BOUNDS, {}, 1)
    until = UntilOffsets({("orders", 0): 20, ("orders", 1): 40})
    with pytest.raises(PlanError, match="stops before the rebuild starts on orders/0: 20 < 30"):
        bound_plan(plan, until, until.offsets)


def test_the_command_line_starts_an_until_from_the_earliest_unless_told():
    args = parse_args(["--processor", "order_state", "--until", "2026-12-03T12:00:00Z"])
    assert args.until == "2026-12-03T12:00:00Z"
    assert reset_spec(args) == ToEarliest()
    args = parse_args(
        ["--processor", "p", "--from-offset", "5", "--until-offsets", "orders,0,9;orders,1,9"]
    )
    assert reset_spec(args) == FromOffset(5)
    with pytest.raises(SystemExit):
        parse_args(["--processor", "p"])  # no start and no moment
    with pytest.raises(SystemExit):
        parse_args(["--processor", "p", "--until", "x", "--until-offsets", "y"])
    gc = parse_args(["gc", "--processor", "p", "--include-as-of", "--generation", "3"])
    assert gc.include_as_of
    assert gc.generation == [3]


def test_the_process_contract_passes_the_ending_offsets():
    argv = process_argv(["p"], generation=3, starting_offsets="{}", ending_offsets='{"t":{"0":5}}')
    assert argv[-2:] == ["--ending-offsets", '{"t":{"0":5}}']
    assert "--ending-offsets" not in process_argv(["p"], generation=3)


class _Probe:
    """The driver's offsets probe: a log whose end moves on."""

    def __init__(self, ends):
        self.ends = ends

    def partitions(self, topic):
        return sorted(p for t, p in self.ends if t == topic)

    def start_offsets(self, tps):
        return {tp: 0 for tp in tps}

    def end_offsets(self, tps):
        return {tp: self.ends[tp] for tp in tps}


def test_the_source_stops_at_its_ending_offsets():
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "x:9092",
            "subscribe": "orders",
            "startingOffsets": "earliest",
            "endingOffsets": '{"orders":{"0":40}}',
            "maxOffsetsPerTrigger": "30",
        }
    )
    assert options.ending_offsets == ((("orders", 0), 40),)
    reader = KafkaStreamReader(options)
    probe = _Probe({("orders", 0): 100, ("orders", 1): 10})
    reader._probe = probe  # the driver's client, faked
    planned = [reader.latestOffset() for _ in range(4)]
    # Partition 1 is unbounded; partition 0 stops before 40, however the log grows.
    assert planned[-1] == {"orders": {"0": 40, "1": 10}}
    probe.ends[("orders", 0)] = 500
    assert reader.latestOffset() == {"orders": {"0": 40, "1": 10}}
    with pytest.raises(ValueError, match="endingOffsets"):
        SourceOptions.parse(
            {"kafka.bootstrap.servers": "x", "subscribe": "t", "endingOffsets": "{bad"}
        )


def test_the_control_api_takes_the_moment_as_replay_plan_does():
    request = PlanRequest(to="earliest", until="2026-12-03T12:00:00Z")
    assert request.flags()[:3] == ["--to-earliest", "--until", "2026-12-03T12:00:00Z"]
    by_offsets = PlanRequest(to="offset", offset=5, until_offsets="orders,0,9")
    assert "--until-offsets" in by_offsets.flags()
    with pytest.raises(ValueError, match="one moment"):
        PlanRequest(to="earliest", until="2026-12-03T12:00:00Z", until_offsets="orders,0,9")
