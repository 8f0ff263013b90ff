"""LogOffsets when a partition's leader is gone: librdkafka answers OFFSET_INVALID, no error.

librdkafka 2.16's ListOffsets waits for the leader its metadata names until the request's
timeout, then returns that leader's partitions with offset OFFSET_INVALID and no error, and the
same client keeps the stale leader (found by tests/spark/test_kafka_failover.py: a processor's
every trigger waited 30 s, and the dead node's partitions never moved). A fake admin client
stands in for librdkafka here: the unanswered partitions are asked again through a new client.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException

from refold.contracts.kafka import offsets as offsets_module
from refold.contracts.kafka.offsets import LogOffsets, OffsetsError


@dataclass
class _Answer:
    offset: int


class _FakeAdmin:
    """Answers each partition with ``ends`` unless its leader is ``away`` (OFFSET_INVALID)."""

    def __init__(
        self, ends: dict[tuple[str, int], int], away: set[tuple[str, int]], timeouts: int = 0
    ) -> None:
        self.ends, self.away, self.timeouts = ends, away, timeouts
        self.asked: list[tuple[list[tuple[str, int]], float]] = []

    def poll(self, timeout: float) -> int:
        del timeout
        return 0

    def list_offsets(self, request, isolation_level, request_timeout):
        del isolation_level
        self.asked.append(([(tp.topic, tp.partition) for tp in request], request_timeout))
        if self.timeouts:  # the leaders' query did not come back within the attempt
            self.timeouts -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        futures = {}
        for tp in request:
            future: Future = Future()
            key = (tp.topic, tp.partition)
            future.set_result(_Answer(OFFSET_INVALID if key in self.away else self.ends[key]))
            futures[tp] = future
        return futures


def _probe(clients: list[_FakeAdmin], timeout: float = 30.0) -> LogOffsets:
    probe = LogOffsets({"bootstrap.servers": "127.0.0.1:9"}, timeout=timeout)
    made = iter(clients)

    def _admin_client() -> _FakeAdmin:
        if probe._admin is None:
            probe._admin = next(made)
        return probe._admin

    probe._admin_client = _admin_client  # type: ignore[method-assign]
    return probe


def test_a_partition_whose_leader_is_away_is_asked_again_through_a_new_client():
    ends = {("t", 0): 10, ("t", 1): 20, ("t", 2): 30}
    stale = _FakeAdmin(ends, away={("t", 1)})  # metadata that names the dead leader
    fresh = _FakeAdmin(ends, away=set())  # reads the metadata afresh: the new leader
    probe = _probe([stale, fresh])

    assert probe.end_offsets(list(ends)) == ends
    # Each attempt is short, and the second asks only for what the first left unanswered.
    assert stale.asked == [([("t", 0), ("t", 1), ("t", 2)], offsets_module._ATTEMPT_S)]
    assert fresh.asked == [([("t", 1)], offsets_module._ATTEMPT_S)]


def test_an_attempt_that_no_leader_answered_gets_twice_as_long_the_next_time():
    ends = {("t", 0): 10}
    clients = [_FakeAdmin(ends, away={("t", 0)}), _FakeAdmin(ends, away=set())]
    probe = _probe(clients)

    assert probe.end_offsets(list(ends)) == ends
    assert [c.asked[0][1] for c in clients] == [
        offsets_module._ATTEMPT_S,
        2 * offsets_module._ATTEMPT_S,
    ]


def test_an_attempt_that_timed_out_is_made_again_by_the_same_client_twice_as_long():
    ends = {("t", 0): 10}
    slow = _FakeAdmin(ends, away=set(), timeouts=2)  # a loaded machine: the query is slow
    probe = _probe([slow])

    assert probe.end_offsets(list(ends)) == ends
    attempt = offsets_module._ATTEMPT_S
    assert [timeout for _tps, timeout in slow.asked] == [attempt, 2 * attempt, 4 * attempt]


def test_a_leader_that_never_answers_is_an_offsets_error_naming_the_partition(monkeypatch):
    clock = iter(range(0, 1000, 4))  # each look at the clock: 4 s later
    monkeypatch.setattr(offsets_module.time, "monotonic", lambda: float(next(clock)))
    ends = {("t", 0): 10, ("t", 1): 20}
    probe = _probe([_FakeAdmin(ends, away={("t", 1)}) for _ in range(20)], timeout=10.0)

    with pytest.raises(OffsetsError, match=r"no leader answered for the offsets of t/1 within 10s"):
        probe.end_offsets(list(ends))
