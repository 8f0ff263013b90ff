"""bench/peers: the correctness check of ``make bench-peers`` against refold's oracle."""

import itertools

import orjson
import pytest

from bench.latency import LatencyResult
from bench.peers.oracle import compare, merged_states, oracle_states
from bench.peers.report import OrderFold, Progress
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
    for path, states in (
        (first, {"o-1": (5, {"status": "placed"}), "o-2": (9, {"status": "paid"})}),
        (second, {"o-1": (7, {"status": "paid"})}),
    ):
        progress = Progress(tmp_path / "progress.json", {0: 10}, keep_states=True)
        for key, (offset, state) in states.items():
            progress.seen(key, 0, offset, state)
        progress.dump_states(path)
        progress.write()
    assert merged_states([first, second]) == {"o-1": {"status": "paid"}, "o-2": {"status": "paid"}}
    assert orjson.loads((tmp_path / "progress.json").read_bytes())["offsets"] == {"0": 7}


def test_latency_percentiles_are_of_the_sorted_values():
    result = LatencyResult.of(5000, [float(v) for v in range(101, 0, -1)])
    assert (result.events, result.p50, result.p95, result.p99, result.max) == (
        101,
        51.0,
        96.0,
        100.0,
        101.0,
    )
