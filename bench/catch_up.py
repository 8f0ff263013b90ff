"""Catch-up runs: processes folding a pre-produced backlog, measured from Redis and ``/proc``.

Progress is read where readers see it: the applied positions of each processor's live
generation (their sum is the number of records applied; for a re-keyed processor the minimum
over its writer slots). Batch 0 pays for the JVM and Python worker start, so the steady rate
of a processor is measured from the commit that completed its batch 0 to the end.

Memory is the resident set (``VmRSS``) summed over every process a processor process started,
sampled every :data:`_RSS_EVERY_S`: the driver, the Spark JVM, PySpark's worker daemons and
their workers. A daemon makes a process group of its own (``pyspark/daemon.py``), so the
processes are found by their parent chain as well as by the process group. ``Pss`` is summed
beside it: VmRSS counts pages shared between processes once in each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from refold.contracts.process_group import GroupProcess
from refold.contracts.progress import progress_bar
from refold.contracts.store.generations import GenerationRegistry

__all__ = ["CatchUp", "ProcessorCatchUp", "Run", "TreeUsage", "Watched", "run_catch_up"]

# Progress is sampled every 20 ms (a batch commit is timed to that); VmRSS every 0.5 s, well
# below the length of a batch, for ~5 ms of /proc reading. Pss costs ~40 ms a sample (the
# kernel walks the JVMs' page tables), so only every 5 s: on 2 cores the sampler must not take
# CPU from what it measures.
_POLL_S = 0.02
_RSS_EVERY_S = 0.5
_PSS_EVERY_S = 5.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# Issue 23's start-up target: the first 100k events applied within 10 s of the start.
FIRST_EVENTS = 100_000


@dataclass(frozen=True, slots=True)
class Watched:
    """A processor whose catch-up is measured: its registry and its backlog (records)."""

    name: str
    registry: GenerationRegistry
    total: int


@dataclass(frozen=True, slots=True)
class Run:
    """One process of a catch-up (not started yet) and the processors it runs."""

    process: GroupProcess
    processors: tuple[Watched, ...]


@dataclass(frozen=True, slots=True)
class ProcessorCatchUp:
    """One processor's catch-up; times in seconds since the processes were started."""

    events: int
    first_write_s: float
    batch0_events: int
    batch0_s: float
    done_s: float
    slots: int  # writer slots of a re-keyed processor, 0 otherwise
    # When the first FIRST_EVENTS records (or all, if fewer) were applied: what a user waits
    # for before a new processor's or a replay's first state is worth reading.
    first_events_s: float = 0.0

    @property
    def rate_steady(self) -> float:
        """Events per second after batch 0 (0 when batch 0 was everything)."""
        rest = self.events - self.batch0_events
        return rest / max(self.done_s - self.batch0_s, 1e-9) if rest > 0 else 0.0

    def summary(self) -> dict[str, float]:
        """The figures of ``bench/results/latest.json`` for a processor caught up alone."""
        return {
            "events": self.events,
            "wall_s": self.done_s,
            "rate_wall": self.events / self.done_s,
            "batch0_events": self.batch0_events,
            "batch0_s": self.batch0_s,
            "rate_steady": self.rate_steady,
            "startup_to_first_write_s": self.first_write_s,
            "first_events": min(FIRST_EVENTS, self.events),
            "first_events_s": self.first_events_s,
            "slots": self.slots,
        }


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A catch-up of one or more processes, until every processor applied its backlog."""

    processors: dict[str, ProcessorCatchUp]
    wall_s: float
    peak_rss_mb: float  # the highest VmRSS sum over all the processes, at one sample
    peak_pss_mb: float  # the same for Pss (shared pages divided), sampled every 5 s only
    peak_rss_mb_by_process: tuple[float, ...]
    cpu_s: float = 0.0  # CPU seconds (user + system) of every process, as last sampled

    @property
    def events(self) -> int:
        """Records applied, over every processor."""
        return sum(p.events for p in self.processors.values())

    @property
    def rate_wall(self) -> float:
        """Records applied over every processor per second of wall time, start-up included."""
        return self.events / self.wall_s

    def summary(self) -> dict[str, object]:
        """The figures of ``bench/results/latest.json``."""
        return {
            "events": self.events,
            "wall_s": self.wall_s,
            "rate_wall": self.rate_wall,
            "peak_rss_mb": self.peak_rss_mb,
            "peak_pss_mb": self.peak_pss_mb,
            "peak_rss_mb_by_process": list(self.peak_rss_mb_by_process),
            "cpu_s": self.cpu_s,
            "processors": {name: p.summary() for name, p in self.processors.items()},
        }


@dataclass(slots=True)
class _Progress:
    """What is known of one processor's live generation, and its batch 0."""

    watched: Watched
    generation: int | None = None
    slots: int | None = None  # writer slots of a re-keyed generation (0: not re-keyed)
    done: int = 0
    first_write: float | None = None
    first_events: float | None = None
    batch0_end: float | None = None
    batch0_done: int | None = None
    done_at: float | None = None

    def applied(self) -> tuple[int, int | None]:
        """Records applied and the last batch id every writer applied (one transaction)."""
        registry = self.watched.registry
        if self.generation is None:
            self.generation = registry.live()
            if self.generation is None:
                return 0, None
        if self.slots is None:  # recorded at start, before the first batch
            recorded = registry.meta(self.generation).get("slots")
            self.slots = None if recorded is None else int(recorded)
        # A re-keyed generation's batch id is kept per writer slot: the slots' minimum.
        positions, batch = registry.positions_of(self.generation, slots=self.slots or 0).read()
        return sum(positions.values()), batch

    def update(self, now: float) -> None:
        """Read the progress at time ``now``."""
        count, batch = self.applied()
        if count <= self.done:
            return
        self.first_write = self.first_write or now
        if self.first_events is None and count >= min(FIRST_EVENTS, self.watched.total):
            self.first_events = now
        # Batches run one after the other: batch 0 (JVM and Python worker warm-up) ends with
        # the commit of its last task; steady state is measured from there.
        if batch == 0:
            self.batch0_end, self.batch0_done = now, count
        self.done = count
        if count >= self.watched.total:
            self.done_at = now

    def result(self, started: float) -> ProcessorCatchUp:
        """The measurement, once caught up."""
        done_at, first_write = cast("float", self.done_at), cast("float", self.first_write)
        batch0_end, batch0_done = self.batch0_end, self.batch0_done
        if batch0_end is None or batch0_done is None or batch0_done >= self.watched.total:
            batch0_end, batch0_done = done_at, self.watched.total  # one batch: no steady state
        return ProcessorCatchUp(
            events=self.watched.total,
            first_write_s=first_write - started,
            batch0_events=batch0_done,
            batch0_s=batch0_end - started,
            done_s=done_at - started,
            slots=self.slots or 0,
            first_events_s=(self.first_events or done_at) - started,
        )


@dataclass(slots=True)
class TreeUsage:
    """Peak memory and CPU time of process trees, sampled from ``/proc``.

    Memory: VmRSS, and Pss beside it. CPU: user + system time of each process as last seen
    (a process that exits between two samples loses what it used since the last one).
    """

    leaders: tuple[int, ...]
    peak_rss_kb: int = 0  # the highest sum over every tree, at one sample
    peak_pss_kb: int = 0
    peak_rss_kb_by_leader: dict[int, int] = field(default_factory=dict)
    cpu_ticks: dict[int, int] = field(default_factory=dict)  # pid -> utime + stime

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every process seen so far."""
        return sum(self.cpu_ticks.values()) / _TICKS_PER_S

    def sample(self, *, pss: bool) -> None:
        """Add one sample: each leader's tree, and the total over all of them (Pss if ``pss``)."""
        rss_total = pss_total = 0
        for leader, pids in _trees(self.leaders).items():
            for pid in pids:
                ticks = _cpu_ticks(pid)
                if ticks is not None:
                    self.cpu_ticks[pid] = ticks
            sizes = [_memory_kb(pid, pss=pss) for pid in pids]
            rss = sum(r for r, _p in sizes)
            rss_total += rss
            pss_total += sum(p for _r, p in sizes)
            self.peak_rss_kb_by_leader[leader] = max(self.peak_rss_kb_by_leader.get(leader, 0), rss)
        self.peak_rss_kb = max(self.peak_rss_kb, rss_total)
        self.peak_pss_kb = max(self.peak_pss_kb, pss_total)


def _trees(leaders: Sequence[int]) -> dict[int, list[int]]:
    """The processes of each leader: its process group, and its descendants in other groups."""
    parent: dict[int, int] = {}
    group: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            # pid (comm) state ppid pgrp ...: comm may contain spaces and parentheses.
            fields = stat[stat.rindex(")") + 2 :].split()
            parent[int(entry.name)], group[int(entry.name)] = int(fields[1]), int(fields[2])
    trees: dict[int, list[int]] = {leader: [] for leader in leaders}
    for pid in parent:
        owner, node = (group[pid] if group[pid] in trees else None), pid
        while owner is None and node in parent and node > 1:
            owner, node = (node if node in trees else None), parent[node]
        if owner is not None:
            trees[owner].append(pid)
    return trees


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process in clock ticks (None once it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _memory_kb(pid: int, *, pss: bool) -> tuple[int, int]:
    """VmRSS and Pss (0 unless ``pss``) of a process in kB (0 once it has exited).

    VmRSS counts a page shared by several processes (a forked Python worker's pages that are
    still its daemon's, the JVM's mapped jars) in each of them; Pss divides it among them.
    """
    rss = shared = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
                break
        if pss:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    shared = int(line.split()[1])
                    break
    except OSError:  # exited meanwhile
        pass
    return rss, shared


def run_catch_up(runs: Sequence[Run], desc: str) -> CatchUp:
    """Start ``runs`` together and wait until each of their processors applied its backlog.

    Every process is stopped at the end, also when one of them fails.

    Raises:
        RuntimeError: A process exited before its processors caught up (with its log's end).
    """
    progress = {w.name: _Progress(w) for run in runs for w in run.processors}
    total = sum(p.watched.total for p in progress.values())
    started = time.monotonic()
    try:
        for run in runs:
            run.process.start()
        memory = TreeUsage(tuple(run.process.pid for run in runs))
        sampled = pss_sampled = 0.0
        with progress_bar(total=total, unit="ev", desc=desc) as bar:
            while True:
                now = time.monotonic()
                for one in progress.values():
                    if one.done_at is None:
                        one.update(now)
                done = sum(p.done for p in progress.values())
                if done != bar.n:
                    bar.update(done - bar.n)
                if all(p.done_at is not None for p in progress.values()):
                    break
                if now - sampled >= _RSS_EVERY_S:
                    pss = now - pss_sampled >= _PSS_EVERY_S
                    memory.sample(pss=pss)
                    sampled, pss_sampled = now, now if pss else pss_sampled
                for run in runs:
                    _check_alive(run, progress)
                time.sleep(_POLL_S)
        finished = time.monotonic()
        memory.sample(pss=False)  # the CPU used up to the end
    finally:
        for run in runs:
            run.process.stop()
    return CatchUp(
        processors={name: p.result(started) for name, p in progress.items()},
        wall_s=finished - started,
        peak_rss_mb=memory.peak_rss_kb / 1024,
        peak_pss_mb=memory.peak_pss_kb / 1024,
        peak_rss_mb_by_process=tuple(
            memory.peak_rss_kb_by_leader.get(p, 0) / 1024 for p in memory.leaders
        ),
        cpu_s=memory.cpu_s,
    )


def _check_alive(run: Run, progress: dict[str, _Progress]) -> None:
    if run.process.alive():
        return
    behind = [progress[w.name] for w in run.processors if progress[w.name].done_at is None]
    for one in behind:  # it may have committed its last batch and exited since the last read
        one.update(time.monotonic())
    if any(one.done_at is None for one in behind):
        names = ", ".join(w.name for w in run.processors)
        msg = f"the process of {names} exited early:\n{run.process.log_tail()}"
        raise RuntimeError(msg)
