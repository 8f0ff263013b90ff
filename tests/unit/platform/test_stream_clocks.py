"""Event time over a derived topic: per-stream clocks, watermark markers, the idle timeout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from refold.contracts.processors import EventTime
from refold.contracts.watermarks import WATERMARK, Marker, is_marker, marker_headers, read_marker
from refold.processors.fold.eventtime import PartitionClocks, Verdict
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.stream_clocks import (
    StreamClocks,
    TopicClocks,
    stream_clock_field,
    stream_of,
)
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget
from refold.processors.runtime.intake import Intake
from refold.processors.runtime.output_transactions import Outbox

PROPERTY = settings(max_examples=200, derandomize=True, database=None, deadline=None)
P = "order_state.changes/3"
A, B = "order_state|commerce.orders/0", "order_state|commerce.orders/1"
HOUR = 3_600_000

# One step of a derived partition's log: a record (stream, at) or a marker.
Step = tuple[str, int] | Marker


def _run(steps: list[Step], lateness: int, idle: int | None, cuts: frozenset[int] = frozenset()):
    """Judge ``steps`` in log order, a new transaction (stored clocks only) at each cut."""
    event_time = EventTime(field="changed_at", lateness_ms=lateness)
    stored: dict[str, int] = {}
    clocks = StreamClocks(event_time, stored, idle)
    verdicts, partition = [], []
    for i, step in enumerate(steps):
        if i in cuts:
            stored.update(clocks.changed)
            clocks = StreamClocks(event_time, stored, idle)
        if isinstance(step, Marker):
            clocks.mark(P, step)
        else:
            verdicts.append(clocks.observe(P, *step))
        partition.append(clocks.clock(P))
    stored.update(clocks.changed)
    return verdicts, partition, stored


def _interleave(draw, streams: dict[str, list[Step]]) -> list[Step]:
    """Some interleaving of the streams' steps, each stream's kept in its own order."""
    queues = {s: list(steps) for s, steps in streams.items()}
    out = []
    while any(queues.values()):
        stream = draw(st.sampled_from(sorted(s for s, q in queues.items() if q)))
        out.append(queues[stream].pop(0))
    return out


def _produced(stream: str, chunks: list[list[int]], of: int) -> list[Step]:
    """A stream as its producer writes it: each transaction's records, then its marker."""
    steps: list[Step] = []
    for chunk in chunks:
        steps += [(stream, at) for at in chunk]
        steps.append(Marker({stream: max(chunk)}, of))
    return steps


@st.composite
def _ordered_streams(draw):
    """2-4 streams, each in event-time order in transactions, starting hours apart."""
    n = draw(st.integers(2, 4))
    streams = {}
    for i in range(n):
        at = draw(st.integers(0, 6 * HOUR))
        chunks = []
        for _ in range(draw(st.integers(1, 4))):
            chunk = []
            for step in draw(st.lists(st.integers(0, 10 * 60_000), min_size=1, max_size=5)):
                at += step
                chunk.append(at)
            chunks.append(chunk)
        name = f"order_state|commerce.orders/{i}"
        streams[name] = _produced(name, chunks, n)
    return _interleave(draw, streams)


@given(_ordered_streams(), st.data())
@PROPERTY
def test_streams_in_order_are_never_late_however_they_interleave(steps, data):
    verdicts, partition, stored = _run(steps, lateness=0, idle=None)
    assert set(verdicts) == {Verdict.ON_TIME}
    newest: dict[str, int] = {}
    for step in steps:
        if not isinstance(step, Marker):
            newest[step[0]] = max(newest.get(step[0], step[1]), step[1])
    assert partition[-1] == min(newest.values())  # the slowest stream, once all have spoken
    # ... and any split into transactions decides the same, record by record.
    cuts = frozenset(data.draw(st.sets(st.integers(0, len(steps) - 1))))
    assert _run(steps, lateness=0, idle=None, cuts=cuts) == (verdicts, partition, stored)


def test_the_same_partition_judged_raw_needs_the_whole_span_as_lateness():
    # B's batch was folded after A's: B's changes follow A's, 5 hours back in event time.
    steps: list[Step] = [(A, 5 * HOUR), (A, 5 * HOUR + 1), (B, 0), (B, 1)]
    raw = PartitionClocks(EventTime(field="changed_at", lateness_ms=HOUR), {})
    assert [raw.observe(P, at) for _s, at in steps][2] is Verdict.LATE
    verdicts, _partition, _stored = _run(steps, lateness=0, idle=None)
    assert verdicts == [Verdict.ON_TIME] * 4


def test_the_partition_clock_waits_for_every_stream_then_follows_the_slowest():
    steps: list[Step] = [
        (A, 50),
        Marker({A: 50}, 2),
        (B, 20),
        Marker({B: 20}, 2),
        (B, 70),
        Marker({B: 70}, 2),
        (A, 60),
        Marker({A: 60}, 2),
    ]
    _verdicts, partition, stored = _run(steps, lateness=100, idle=None)
    assert partition == [None, None, 20, 20, 50, 50, 60, 60]
    assert stored == {
        P: 60,
        stream_clock_field(P, A): 60,
        stream_clock_field(P, B): 70,
        stream_clock_field(P, "#"): 2,
        stream_clock_field(P, "^"): 50,
    }


def test_a_record_below_the_partition_watermark_is_late_whatever_its_stream():
    new = "order_state|commerce.orders/7"
    steps: list[Step] = [Marker({A: 50, B: 60}, 2), (new, 10), (A, 44), (B, 44)]
    verdicts, partition, _stored = _run(steps, lateness=5, idle=None)
    assert partition == [50, 50, 50, 50]  # never back, not even for a stream it did not know
    assert verdicts == [Verdict.LATE, Verdict.LATE, Verdict.LATE]


def test_markers_move_a_partition_that_receives_no_record():
    steps: list[Step] = [Marker({A: 40}, 2), Marker({B: 30}, 2), Marker({A: 90, B: 80}, 2)]
    _verdicts, partition, _stored = _run(steps, lateness=0, idle=None)
    assert partition == [None, 30, 80]


def test_a_quiet_stream_holds_the_partition_back_by_at_most_the_idle_timeout():
    minutes = [m * 60_000 for m in range(121)]
    steps: list[Step] = [Marker({A: 0, B: 0}, 2), *(Marker({A: m}, 2) for m in minutes)]
    _verdicts, held, _stored = _run(steps, lateness=0, idle=None)
    assert held[-1] == 0  # without a timeout B holds it back for good
    _verdicts, partition, _stored = _run(steps, lateness=0, idle=HOUR)
    assert partition[61] == 0  # B an hour behind: still live
    assert partition[62] == 61 * 60_000  # then left out
    assert partition[-1] == 120 * 60_000
    # B wakes up: its records are judged against the partition's clock, then it is live again.
    later: list[Step] = [*steps, (B, 30 * 60_000), (B, 119 * 60_000), (B, 125 * 60_000)]
    verdicts, partition, _stored = _run(later, lateness=10 * 60_000, idle=HOUR)
    assert verdicts == [Verdict.LATE, Verdict.ON_TIME, Verdict.ON_TIME]
    assert partition[-1] == 120 * 60_000


def test_a_stream_never_heard_of_is_idle_once_the_others_are_past_the_timeout():
    steps: list[Step] = [Marker({A: m * 60_000}, 2) for m in range(10, 90, 10)]
    _verdicts, partition, _stored = _run(steps, lateness=0, idle=HOUR)
    assert partition == [None] * 7 + [80 * 60_000]  # 80 - 10 minutes > an hour
    _verdicts, partition, _stored = _run(steps, lateness=0, idle=None)
    assert set(partition) == {None}


@given(_ordered_streams(), st.integers(0, 2 * HOUR), st.integers(0, HOUR))
@PROPERTY
def test_an_on_time_record_is_never_below_the_partition_watermark(steps, idle, lateness):
    event_time = EventTime(field="changed_at", lateness_ms=lateness)
    clocks = StreamClocks(event_time, {}, idle)
    for step in steps:
        before = clocks.clock(P)
        if isinstance(step, Marker):
            clocks.mark(P, step)
        elif clocks.observe(P, *step) is Verdict.ON_TIME and before is not None:
            assert step[1] >= before - lateness
        after = clocks.clock(P)
        assert before is None or (after is not None and after >= before)


def test_a_negative_idle_timeout_is_refused():
    with pytest.raises(ValueError, match="idle_ms"):
        StreamClocks(EventTime(field="t"), {}, -1)


def test_marker_headers_round_trip():
    headers = marker_headers(Marker({B: 2, A: 1}, 8))
    assert headers == [(WATERMARK, f'{{"at":{{"{A}":1,"{B}":2}},"of":8}}'.encode())]
    assert is_marker(headers)
    assert read_marker(headers) == Marker({A: 1, B: 2}, 8)
    assert not is_marker([("refold.origin.id", b"x")])
    assert read_marker(None) is None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"nope",
        b"[]",
        b'{"at": {}, "of": 1}',
        b'{"at": {"s": "1"}, "of": 1}',
        b'{"at": {"s": true}, "of": 1}',
        b'{"at": {"s": 1}}',
        b'{"at": {"s": 1, "t": 2}, "of": 1}',
        b'{"at": {"s": 1}, "of": 1, "x": 0}',
    ],
)
def test_a_bad_marker_is_refused(value):
    with pytest.raises(ValueError, match=WATERMARK):
        read_marker([(WATERMARK, value)])
    with pytest.raises(ValueError, match=WATERMARK):
        marker_headers(Marker({}, 1))


def test_topic_clocks_judge_derived_topics_per_stream_and_the_others_per_partition():
    event_time = EventTime(field="changed_at", lateness_ms=0)
    stored = {
        "src/0": 100,
        P: 50,
        stream_clock_field(P, A): 50,
        "s1|src/0": 7,  # a writer slot's copy: not this writer's
    }
    clocks = TopicClocks(event_time, stored, frozenset({"order_state.changes"}))
    assert clocks.clock("src", 0) == 100
    assert clocks.observe("src", 0, "", 99) is Verdict.LATE  # one clock per raw partition
    # On the derived topic, a record is judged against its own stream's clock and the
    # partition's: a new stream's first record below another's clock is on time above the
    # partition's watermark.
    assert clocks.observe("order_state.changes", 3, B, 60) is Verdict.ON_TIME
    clocks.mark("order_state.changes", 3, Marker({A: 80, B: 70}, 2))
    assert clocks.clock("order_state.changes", 3) == 70  # the slowest of the two streams
    assert clocks.observe("order_state.changes", 3, A, 65) is Verdict.LATE
    assert clocks.changed[P] == 70
    assert clocks.clocks == {"src/0": 100, P: 70}


def test_a_record_s_stream_is_its_origin_id_s():
    assert stream_of(f"{A}@12.0") == A
    assert stream_of("order_state#2|commerce.orders/1@3.1") == "order_state#2|commerce.orders/1"
    assert stream_of(None) == ""
    assert stream_of("window:x") == ""


def test_the_outbox_marks_every_partition_with_each_stream_s_newest_time():
    outbox = Outbox()
    for stream, at in ((A, 5), (A, 9), (A, 7), (B, 3)):
        outbox.mark("changes", stream, at)
    markers = outbox.markers({"changes": 3}.__getitem__, streams=8)
    assert [m.partition for m in markers] == [0, 1, 2]
    assert all(m.topic == "changes" and m.key is None and m.value is None for m in markers)
    assert [read_marker(m.headers) for m in markers] == [Marker({A: 9, B: 3}, 8)] * 3
    assert Outbox().markers({"changes": 3}.__getitem__, streams=8) == []


def test_the_intake_passes_markers_by_and_dead_letters_a_bad_one():
    target = FoldTarget(
        "customer_orders",
        1,
        "redis://unused",
        "p",
        (),
        "dlq",
        event_time=EventTime(field="changed_at"),
        topics=("order_state.changes",),
        stream_topics=("order_state.changes",),
    )

    class _Fold:
        name = "customer_orders"
        event_types = ("OrderStatusChanged",)

    intake = Intake(target, _Fold(), codec=None, slot=None, keyed=True)  # type: ignore[arg-type]
    good = marker_headers(Marker({A: 5}, 8))
    records = [
        SourceRecord("order_state.changes", 3, 10, None, None, headers=tuple(good)),
        SourceRecord("order_state.changes", 3, 11, None, None, headers=((WATERMARK, b"{}"),)),
    ]
    pending, dead, markers, new_pos = [], [], [], {}
    outcome = BatchOutcome()
    intake.take(records, {}, pending, dead, new_pos, outcome, markers)
    assert pending == []
    assert [(m.record.offset, m.marker) for m in markers] == [(10, Marker({A: 5}, 8))]
    assert [(d.record.offset, d.reason) for d in dead] == [(11, "bad-marker")]
    assert new_pos == {P: 12}
    assert outcome.passed == 1
