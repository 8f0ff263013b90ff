"""State as of a moment (DESIGN.md decision 21, issue 45 item 5), end to end.

The orders log is written in four parts, a moment noted between each. order_state (entities)
and sales_windows (event-time windows) fold all of it in one application (generation 1 of
each). Then ``replay --until`` builds three order_state generations, as of the end of the
first, second and third part (two by time, through Kafka's time index; one by explicit
offsets), each kept beside the live one without a flip. Each stops exactly at the log end its
part left, equals the oracle folded over the events below those offsets, and ``replay diff``
against live lists exactly the entities that changed since. A sales_windows generation as of
the second moment has the window buckets and the partition clocks (the watermark then) of the
window oracle over those records. ``replay gc`` keeps them unless asked; bad moments are
refused naming the log's first and last timestamps.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.store.generations import AS_OF_FIELD, GenerationRegistry
from refold.contracts.windows import windows_from_meta
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_windows
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.replay.as_of import UntilTime
from refold.replay.errors import PlanError
from refold.replay.generations_admin import (
    collect_garbage,
    diff_generations,
    generation_status,
)
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay
from refold.services.reader.window_reader import WindowReader
from tests.support.waiting import assert_eventually
from tests.support.windows import bucket_dump, log_events

from .conftest import oracle


def _replay(env: dict[str, str], *args: str) -> str:
    """``replay ...`` as a user runs it; its output (asserted to succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "refold.replay", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


@pytest.mark.timeout(600)
def test_three_moments_each_equal_the_oracle_up_to_their_offsets_and_diff_against_live(
    world, make_topic
):
    events = list(OrderSimulator(500, seed=45))
    quarter = len(events) // 4
    parts = [events[i * quarter : (i + 1) * quarter] for i in range(3)] + [events[3 * quarter :]]
    publisher = world.publisher()
    tokens, moments, ends = [], [], []
    topic = world.topic.name
    tps = [(topic, p) for p in range(world.topic.partitions)]
    with world.offsets() as offsets:
        for number, part in enumerate(parts):
            tokens += publisher.emit_many(part)
            if number < 3:
                # Every record so far has a timestamp at or before the moment; the next part's
                # come after it.
                ends.append(offsets.end_offsets(tps))
                time.sleep(0.02)
                moments.append(datetime.now(UTC))
                time.sleep(0.02)
        final = offsets.end_offsets(tps)
    publisher.close()
    prefix = world.redis.key_prefix
    launcher = dataclasses.replace(
        world.launcher,
        options={
            **world.launcher.options,
            "sales_windows": ProcessorOptions(
                topics=[world.topic.name],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                windows_topic=make_topic(partitions=1, prefix="windows"),
                max_offsets_per_trigger=5000,
            ),
        },
    )
    registry = GenerationRegistry.of(world.client, "order_state", prefix)
    windows = GenerationRegistry.of(world.client, "sales_windows", prefix)
    app = GroupProcess(
        launcher.argv(["order_state", "sales_windows"]),
        launcher.env(),
        world.state_dir / "live.log",
    ).start()
    try:
        assert_eventually(
            lambda: all(r.live() == 1 and r.positions(1)[0] == final for r in (registry, windows)),
            timeout=240,
            alive=app.alive,
            message=app.log_tail,
        )
    finally:
        app.stop()
    live = registry.live()
    spec = processor_spec("order_state")
    env = {**os.environ, **launcher.env()}

    # Bad moments: refused before anything is built, naming the moment and the log's times.
    for moment, says in (
        (datetime.now(UTC) + timedelta(hours=1), "is in the future"),
        (moments[0] - timedelta(days=1), "is before the first event"),
    ):
        with pytest.raises(PlanError, match=says) as refused:
            plan_replay(
                spec, ToEarliest(), world.kafka, world.client, prefix, until=UntilTime(moment)
            )
        assert moment.isoformat() in str(refused.value)
        assert "the log's records run from" in str(refused.value)
    assert [g.generation for g in registry.list()] == [1]

    built = []
    for number, moment in enumerate(moments):
        if number == 1:  # explicit offsets, as `replay plan --export` prints them
            bound = ["--until-offsets", ";".join(f"{t},{p},{o}" for (t, p), o in ends[1].items())]
        else:
            bound = ["--until", moment.isoformat()]
        out = _replay(env, "--processor", "order_state", *bound, "--execute", "--no-progress")
        generation = max(g.generation for g in registry.list())
        assert f"g{generation} built as of" in out, out[-4000:]
        built.append(generation)
        assert registry.live() == live  # no flip
        assert registry.status(generation) == "as_of"
        # It stopped exactly at the positions of that moment.
        assert registry.positions(generation)[0] == ends[number]
        below = [
            event
            for event, token in zip(events, tokens, strict=True)
            if token.offset < ends[number][(token.topic, token.partition)]
        ]
        expected = oracle(below)
        states, totals = world.state(generation)
        assert states == expected.states, number
        assert totals == dict(expected.aggregate), number
        # replay diff against live: exactly the entities that changed since.
        everything = oracle(events).states
        changed = {
            f"orders:{key}"
            for key in expected.states.keys() | everything.keys()
            if expected.states.get(key) != everything.get(key)
        }
        diff = diff_generations(spec, world.client, prefix, generation, live)
        assert changed, number  # each moment is before some changes
        assert set(diff.differing + diff.only_in_a + diff.only_in_b) == changed, number
        assert len(diff.only_in_b) < len(changed)  # some existed then and changed since

    # Windows as they were at the second moment: buckets and clocks (the watermark then).
    out = _replay(
        env, "--processor", "sales_windows", "--until", moments[1].isoformat(), "--execute"
    )
    as_of = max(g.generation for g in windows.list())
    assert (windows.live(), windows.status(as_of)) == (1, "as_of"), out[-4000:]
    assert windows.positions(as_of)[0] == ends[1]
    records = [
        (field, offset, event_type, event)
        for field, offset, event_type, event in log_events(world.kafka.bootstrap_servers, topic)
        if offset < ends[1][(topic, int(field.rsplit("/", 1)[1]))]
    ]
    then = fold_windows(SalesWindows(), SALES_WINDOWS.event_time, records)
    assert then.buckets
    assert then.clocks
    assert bucket_dump(world.client, windows.keys(as_of)) == then.buckets
    assert bucket_dump(world.client, windows.keys(1)) != then.buckets  # they moved on since
    folds, distinct = windows_from_meta(windows.meta(as_of))
    reader = WindowReader(
        world.client,
        "sales_windows",
        folds,
        distinct,
        prefix,
        lateness_ms=SALES_WINDOWS.event_time.lateness_ms,
    )
    assert reader.watermark(as_of).value.clocks == then.clocks
    assert reader.watermark(as_of).value.clocks != reader.watermark(1).value.clocks

    status = {
        row.generation: row for row in generation_status(spec, world.client, prefix, offsets=None)
    }
    assert status[built[0]].meta[AS_OF_FIELD] == moments[0].isoformat()
    assert status[built[1]].meta[AS_OF_FIELD] == "offsets"
    assert status[built[0]].runner.startswith(f"as of {moments[0].isoformat()}")
    out = _replay(env, "status", "--processor", "order_state")
    assert f"as of {moments[2].isoformat()}" in out

    root = checkpoint_root(world.state_dir, world.launcher.spark, key_prefix=prefix)
    assert collect_garbage(spec, world.client, prefix, str(root), execute=True) == []
    assert set(registry.positions(built[0])[0]) == set(ends[0])  # still there
    _replay(env, "gc", "--processor", "order_state", "--generation", str(built[0]), "--execute")
    assert registry.status(built[0]) is None
    removed = collect_garbage(
        spec, world.client, prefix, str(root), execute=True, include_as_of=True
    )
    assert [g for g, _keys in removed] == built[1:]
    assert [g.generation for g in registry.list()] == [live]
