"""LogProbe against a fake broker: cached, bounded in time, never hammering."""

import threading
import time
from contextlib import contextmanager

from refold.contracts.kafka.offsets import OffsetsError
from refold.services.monitor.lag import LogProbe


class _Broker:
    """A fake LogOffsets: counts calls; can hang until released, or fail."""

    def __init__(self) -> None:
        self.topics = {"orders": [0, 1]}
        self.ends = {("orders", 0): 10, ("orders", 1): 4}
        self.stamps = {("orders", 0, 7): 1_000}
        self.calls = {"partitions": 0, "end_offsets": 0, "record_timestamp": 0}
        self.hang = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def _wait(self) -> None:
        if self.hang.is_set():
            self.release.wait(10)
        if self.fail:
            msg = "cannot read metadata"
            raise OffsetsError(msg) from OSError("down")

    def partitions(self, topic):
        self.calls["partitions"] += 1
        self._wait()
        if topic not in self.topics:
            msg = f"topic {topic} is not available"
            raise OffsetsError(msg)
        return self.topics[topic]

    def end_offsets(self, tps):
        self.calls["end_offsets"] += 1
        self._wait()
        return {tp: self.ends[tp] for tp in tps}

    def record_timestamp(self, topic, partition, offset):
        self.calls["record_timestamp"] += 1
        self._wait()
        found = self.stamps.get((topic, partition, offset))
        return None if found is None else (found, offset)


def _probe(broker: _Broker, **kwargs) -> LogProbe:
    @contextmanager
    def lend():
        yield broker

    return LogProbe(lend, **kwargs)


def _soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_ends_are_measured_once_per_ttl():
    broker = _Broker()
    probe = _probe(broker, ttl_s=30.0)
    parts, ends = probe.ends(["orders"], _soon())
    assert parts == {"orders": (0, 1)}
    assert ends == {("orders", 0): 10, ("orders", 1): 4}
    probe.ends(["orders"], _soon())
    assert broker.calls["end_offsets"] == 1
    probe.close()


def test_a_missing_topic_has_no_partitions_and_does_not_fail_the_others():
    broker = _Broker()
    probe = _probe(broker)
    parts, ends = probe.ends(["orders", "nope"], _soon())
    assert parts == {"orders": (0, 1), "nope": ()}
    assert set(ends) == {("orders", 0), ("orders", 1)}
    assert probe.healthy
    probe.close()


def test_a_hung_broker_answers_nothing_by_the_deadline_and_no_call_queues_behind_it():
    broker = _Broker()
    broker.hang.set()
    probe = _probe(broker)
    started = time.monotonic()
    assert probe.ends(["orders"], _soon(0.3)) == ({}, {})
    assert probe.ends(["orders"], _soon(0.3)) == ({}, {})
    assert time.monotonic() - started < 2.0
    assert broker.calls["partitions"] == 1  # the second call joined the round in flight
    broker.release.set()
    broker.hang.clear()
    parts, _ends = probe.ends(["orders"], _soon())
    assert parts == {"orders": (0, 1)}
    probe.close()


def test_after_a_failure_the_broker_is_left_alone_and_the_cache_answers():
    broker = _Broker()
    probe = _probe(broker, ttl_s=0.0, backoff_s=60.0)
    _parts, ends = probe.ends(["orders"], _soon())
    assert ends
    broker.fail = True
    probe.ends(["orders"], _soon())  # fails: starts the back-off
    assert not probe.healthy
    assert "cannot read metadata" in (probe.last_error or "")
    calls = dict(broker.calls)
    _parts, cached = probe.ends(["orders"], _soon())
    assert cached == ends  # recent enough (max_age_s)
    assert broker.calls == calls
    probe.close()


def test_timestamps_are_kept_and_a_missing_record_is_none():
    broker = _Broker()
    probe = _probe(broker)
    assert probe.timestamps([("orders", 0, 7), ("orders", 1, 4)], _soon()) == {
        ("orders", 0, 7): 1_000,
        ("orders", 1, 4): None,
    }
    assert probe.timestamps([("orders", 0, 7)], _soon()) == {("orders", 0, 7): 1_000}
    assert broker.calls["record_timestamp"] == 2  # the first one was kept
    probe.close()
