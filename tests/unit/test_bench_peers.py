"""bench/peers: the correctness check of ``make bench-peers`` against refold's oracle."""

import itertools

import orjson
import pytest

from bench.latency import LatencyResult
from bench.peers.measure import _done_at
from bench.peers.oracle import compare, merged_states, oracle_states
from bench.peers.report import OrderFold, Progress, dump_states
from refold.contracts.codec import EventCodec
from refold.deploy.simulators.orders import OrderSimulator

pytestmark = pytest.mark.unit


def _events(count):
    codec = EventCodec()
    for event_type, event in itertools.islice(OrderSimulator(count // 9 + 1, seed=7), count):
        yield event_type, codec.encode(event_type, event, validated=True)


def test_a_peer_fold_of_the_encoded_log_equals_the_oracle_and_a_wrong_state_fails():
    encoded = list(_events(2_000))
    codec = EventCodec()
    expected = oracle_states(
        (d.event_type, d.data) for d in map(codec.decode, (v for _t, v in encoded))
    )
    fold, states = OrderFold(), {}
    for _event_type, value in encoded:
        key = codec.decode(value).data["order_id"]
        new = fold(states.get(key), value)
        if new is not None:
            states[key] = orjson.loads(orjson.dumps(new))
    assert len(expected) > 100
    assert compare(expected, states).ok
    assert str(compare(expected, states)) == f"ok ({len(expected):,} states)"

    some = next(iter(states))
    wrong = {**states, some: {**states[some], "total_minor": states[some]["total_minor"] + 1}}
    del wrong[list(states)[1]]
    wrong["ord-extra"] = {}
    verdict = compare(expected, wrong)
    assert (verdict.different, verdict.missing, verdict.extra, verdict.ok) == (1, 1, 1, False)
    assert str(verdict).startswith("FAILED (1 differ, 1 missing, 1 extra")


def test_states_of_two_processes_merge_by_the_highest_offset(tmp_path):
    # A rebalance moved order o-1's partition: the process that folded it last wins.
    first, second = tmp_path / "states-0.json", tmp_path / "states-1.json"
    first.write_bytes(
        orjson.dumps({"o-1": [5, {"status": "placed"}], "o-2": [9, {"status": "paid"}]})
    )
    second.write_bytes(orjson.dumps({"o-1": [7, {"status": "paid"}]}))
    assert merged_states([first, second]) == {"o-1": {"status": "paid"}, "o-2": {"status": "paid"}}
    dump_states(first, {"o-3": {"status": "shipped"}})  # a bounded fold's final states
    assert merged_states([first]) == {"o-3": {"status": "shipped"}}


def test_progress_reaches_a_partition_at_its_last_record_and_a_bounded_fold_reports_done(tmp_path):
    path = tmp_path / "progress.json"
    progress = Progress(path, {0: 10, 1: 3})
    for offset in range(10):
        progress.seen(0, offset)
    progress.seen_batch({1: 1})
    body = orjson.loads(path.read_bytes())
    assert body["first"] is not None
    assert (body["offsets"], list(body["reached"]), body["done"]) == ({"0": 9}, ["0"], None)
    assert _done_at([body], {0: 10, 1: 3}, 1) is None  # partition 1 is not at its end
    progress.seen_batch({1: 2})
    body = orjson.loads(path.read_bytes())
    assert _done_at([body], {0: 10, 1: 3}, 1) == max(body["reached"].values())

    progress.finished()  # Bytewax's fold_final: the final states came out
    done = orjson.loads(path.read_bytes())
    assert _done_at([done], {0: 10, 1: 3}, 2) is None  # the other process has not ended yet
    assert _done_at([done, {**done, "done": done["done"] + 1}], {0: 10}, 2) == done["done"] + 1


def test_latency_percentiles_are_of_the_sorted_values():
    result = LatencyResult.of(5000, [float(v) for v in range(101, 0, -1)])
    assert (result.events, result.p50, result.p95, result.p99, result.max) == (
        101,
        51.0,
        96.0,
        100.0,
        101.0,
    )
