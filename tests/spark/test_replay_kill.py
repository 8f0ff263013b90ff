"""`kill -9` of `replay --execute` orphans nothing (issue 18, defect 2).

A replay killed with SIGKILL runs no ``finally``: its rebuild processor (driver, JVM, Python
workers, in a process group of their own) used to keep running, the generation stayed
``building`` forever, and neither the next replay nor ``replay gc`` mentioned it. Now the
rebuild processor stops when its replay is gone, status shows the generation abandoned, the next
replay reports it, gc removes it, and a replay after all that builds a state == the oracle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.simulators.orders import OrderSimulator

from .conftest import oracle

# The processor's micro-batches are small, so the rebuild is still running when it is killed.
BATCH = "500"


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, process group, state) of every process (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after "pid (comm)"
        found.append((int(entry.name), int(fields[1]), int(fields[2]), fields[0]))
    return found


def _children(pid: int) -> list[int]:
    return [p for p, parent, _group, state in _processes() if parent == pid and state != "Z"]


def _group_alive(group: int) -> bool:
    return any(g == group and state != "Z" for _p, _parent, g, state in _processes())


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _replay(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen:
    out = subprocess.DEVNULL if log is None else log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "refold.replay", "--no-progress", *args],
        env={**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the kill below is of replay alone, as a user's kill -9 is
    )


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "refold.replay", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _kill_replay_and_expect_no_orphan(replay: subprocess.Popen) -> None:
    children = _children(replay.pid)
    assert len(children) == 1, children  # the rebuild processor, leader of its own group
    replay.send_signal(signal.SIGKILL)
    replay.wait()
    # It stops as on SIGTERM (finishes its batch, lets go of its lease), JVM and workers too.
    _wait(lambda: not _group_alive(children[0]), 120, "the rebuild's process group to end")


@pytest.mark.timeout(900)
def test_a_killed_replay_leaves_no_rebuild_running_and_its_generation_is_abandoned(
    world, spark, tmp_path
):
    events = list(OrderSimulator(2000, seed=51))
    world.publisher().emit_many(events)
    assert world.run_available_now(spark) == 1  # the live generation the replays rebuild
    env = {**world.env, "REFOLD_ORDER_STATE__MAX_OFFSETS_PER_TRIGGER": BATCH}
    registry = GenerationRegistry.of(world.client, "order_state", world.redis.key_prefix)
    execute = ("--processor", "order_state", "--to-earliest", "--execute")
    log = tmp_path / "replay.log"

    def runner(generation: int) -> str:
        rows = json.loads(_run(env, "status", "--processor", "order_state", "--json"))
        return next(r["runner"] for r in rows if r["generation"] == generation)

    # 1. Killed right after it created g2, while its processor starts.
    first = _replay(env, *execute, log=log)
    _wait(lambda: registry.builder(2) is not None, 120, "g2 and its builder lease")
    _wait(lambda: _children(first.pid), 30, "the rebuild processor")
    _kill_replay_and_expect_no_orphan(first)
    assert registry.status(2) == "building"
    assert runner(2).startswith("abandoned")

    # 2. The next replay says so; killed while its processor folds (positions moving).
    second = _replay(env, *execute, log=log)
    _wait(lambda: registry.status(3) is not None, 120, "g3")
    _wait(lambda: registry.lease_owner(3) is not None, 120, "g3's processor and its lease")
    start = sum(registry.positions(3)[0].values())
    _wait(lambda: sum(registry.positions(3)[0].values()) > start, 120, "g3 to fold a batch")
    _kill_replay_and_expect_no_orphan(second)
    assert registry.lease_owner(3) is None  # released by the clean stop
    assert registry.status(3) == "building"
    assert registry.live() == 1  # no flip happened
    assert "g2 was left building by a replay that is gone" in log.read_text()
    assert runner(3).startswith("abandoned")
    plan = _run(env, "--processor", "order_state", "--to-earliest")
    assert "g2, g3 were left building by a replay that is gone" in plan

    # 3. gc lists and removes them; a replay afterwards builds and flips == the oracle.
    dry = _run(env, "gc", "--processor", "order_state")
    assert "order_state g2: would be removed" in dry
    assert "order_state g3: would be removed" in dry
    assert "g1" not in dry  # live
    _run(env, "gc", "--processor", "order_state", "--execute")
    assert registry.status(2) is None
    assert registry.status(3) is None
    _run(world.env, *execute)  # the processor's own batch size: the rebuild just runs
    generation = registry.live()
    assert generation is not None
    assert generation != 1
    assert registry.status(1) == "retired"
    states, totals = world.state(generation)
    expected = oracle(events)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
