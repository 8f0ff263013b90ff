"""Timers on re-keyed processors, the pure rule: a slot's entities fire on the watermark over
every partition, and the oracle's states do not depend on how the partitions interleave."""

from __future__ import annotations

import heapq
import random

from hypothesis import given, strategies as st

from refold.processors.fold.oracle import fold_timed
from refold.processors.fold.rekey import KeyResolver
from refold.processors.fold.timers import GroupClocks, TimerQueue
from tests.support.customer_sessions import CUSTOMER_SESSIONS_TIME, CustomerSessions

MINUTE = 60_000
RESOLVER = ("customer_id", ("order_id",))


def test_a_slot_s_watermark_waits_for_every_partition_of_every_topic():
    everything = ["orders/0", "orders/1", "returns/0"]
    groups = GroupClocks(("orders", "returns"), 1_000, {"orders/1": 9_000}, everything)
    assert groups.group_of(7) == 0  # one group: the slot's
    assert groups.advance("orders", 0, 50_000) is None  # returns/0 has not started
    assert groups.advance("returns", 0, 20_000) == 9_000 - 1_000  # orders/1 holds it back
    assert groups.advance("orders", 1, 30_000) == 20_000 - 1_000
    assert groups.advance("orders", 1, 10_000) == 20_000 - 1_000  # clocks never go back
    # Co-partitioned, as before: a group per partition id, over the topics at that id.
    partitioned = GroupClocks(("orders", "returns"), 0, {"orders/1": 5, "returns/1": 3})
    assert partitioned.group_of(1) == 1
    assert partitioned.mark(1) == 3
    assert partitioned.mark(0) is None


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.sampled_from("abcde"), st.none() | st.integers(0, 50)),
            st.tuples(st.just("pop"), st.just(""), st.none() | st.integers(0, 50)),
        ),
        max_size=60,
    )
)
def test_the_timer_queue_fires_what_a_sorted_scan_would(ops):
    """The heap (one look per record with nothing due) fires what sorting every timer did."""
    queue, model = TimerQueue(), {}
    queue.load(0, [("a", 10), ("b", 30)])
    model.update({"a": 10, "b": 30})
    for op, entity, value in ops:
        if op == "set":
            queue.set(0, entity, value)
            if value is None:
                model.pop(entity, None)
            else:
                model[entity] = value
            continue
        expected = [] if value is None else sorted((d, e) for e, d in model.items() if d <= value)
        for _due, gone in expected:
            del model[gone]
        assert queue.pop_due(0, value) == expected
    assert queue.entities() == set(model)
    assert heapq.nsmallest(1, model.values()) == heapq.nsmallest(1, queue._due[0].values())


def _placed(order: str, customer: str, at: int) -> tuple[str, dict]:
    return "OrderPlaced", {"order_id": order, "customer_id": customer, "placed_at": at}


def _paid(order: str, at: int) -> tuple[str, dict]:
    return "OrderPaid", {"order_id": order, "paid_at": at}


def _fold(log, partitions=("orders/0", "orders/1")):
    return fold_timed(
        CustomerSessions(),
        CUSTOMER_SESSIONS_TIME,
        ("orders",),
        log,
        KeyResolver(*RESOLVER),
        partitions=partitions,
    )


def test_a_customer_s_session_spans_partitions_and_closes_on_the_slowest_one():
    """Customer a orders on both partitions; the session closes only once both partitions'
    clocks are the gap plus the lateness past its last event, and a payment (linked through
    its order) extends it."""
    log = [
        ("orders", 0, 0, *_placed("o1", "a", 0)),
        ("orders", 1, 0, *_placed("o2", "a", 10 * MINUTE)),
        ("orders", 0, 1, *_paid("o1", 15 * MINUTE)),  # extends the session to 15 min
        ("orders", 0, 2, *_placed("o3", "b", 60 * MINUTE)),  # p0 far ahead; p1 at 10 min
    ]
    held = _fold(log)
    assert held.states["a"]["open"] == [[0, 15 * MINUTE, 2, 1, 0]]
    assert held.aggregate["closed"] == 0
    # p1 moves on: the watermark is min(60, 45) - 5 = 40 min >= 15 + 20: a's session closes.
    moved = _fold([*log, ("orders", 1, 1, *_placed("o4", "c", 45 * MINUTE))])
    assert moved.states["a"] == {"customer_id": "a", "open": [], "closed": 1}
    assert [e.value for e in moved.effects] == [
        {"customer_id": "a", "start": 0, "end": 15 * MINUTE, "events": 3}
    ]
    # A partition that never had an event holds every timer back.
    waiting = _fold(
        [*log, ("orders", 1, 1, *_placed("o4", "c", 45 * MINUTE))],
        partitions=("orders/0", "orders/1", "orders/2"),
    )
    assert waiting.aggregate["closed"] == 0


def _random_log(rng: random.Random, partitions: int) -> list[tuple]:
    """Orders of 12 customers over ``partitions`` partitions (by order), paid later, with
    times moving forward per partition and some events behind (late or within lateness)."""
    logs: dict[int, list[tuple]] = {p: [] for p in range(partitions)}
    clock = dict.fromkeys(range(partitions), 0)
    for n in range(240):
        order, customer = f"o{n}", f"c{rng.randrange(12)}"
        p = rng.randrange(partitions)
        clock[p] += rng.choice([1, 2, 4, 8, 30]) * MINUTE // 4
        placed = clock[p] - rng.choice([0, 0, 0, 3 * MINUTE, 40 * MINUTE])
        logs[p].append(_placed(order, customer, placed))
        if rng.random() < 0.7:
            logs[p].append(_paid(order, clock[p] + rng.randrange(10 * MINUTE)))
    return [("orders", p, o, *event) for p, log in logs.items() for o, event in enumerate(log)]


def _interleave(log: list[tuple], rng: random.Random) -> list[tuple]:
    queues: dict[int, list[tuple]] = {}
    for record in log:
        queues.setdefault(record[1], []).append(record)
    lists, out = list(queues.values()), []
    while lists:
        queue = rng.choice(lists)
        out.append(queue.pop(0))
        if not queue:
            lists.remove(queue)
    return out


def test_the_oracle_s_states_do_not_depend_on_how_the_partitions_interleave():
    """The firing points differ from one interleaving to the next (which partition's record
    moves the watermark past a session); the states, the closed sessions and the late records
    do not, because every event folded after a firing is at or above its watermark."""
    parts = ("orders/0", "orders/1", "orders/2")
    for seed in range(12):
        rng = random.Random(seed)
        log = _random_log(rng, 3)
        first = _fold(log, parts)
        assert first.aggregate["closed"] > 0
        assert first.late
        for _ in range(4):
            other = _fold(_interleave(log, rng), parts)
            assert other.states == first.states
            assert other.aggregate == first.aggregate
            assert sorted(other.late) == sorted(first.late)
            assert sorted(map(repr, other.effects)) == sorted(map(repr, first.effects))
