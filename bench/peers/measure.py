"""Running one engine's processes over the backlog, measured from their progress files.

Done is when every partition's last record was folded (its ``reached`` time in some process's
progress file); the engine is stopped after that (SIGTERM: the Python peers then write their
states). Memory and CPU are sampled from ``/proc`` over the processes' trees
(:class:`bench.catch_up.TreeUsage`) until done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.catch_up import TreeUsage
from refold.contracts.process_group import GroupProcess

__all__ = ["Measured", "measure"]

_POLL_S = 0.05
_SAMPLE_S = 0.5
_END_S = 120.0  # for a bounded job to end by itself once done


@dataclass(frozen=True, slots=True)
class Measured:
    """One engine's run: epoch seconds of its start, first record and last record folded."""

    events: int
    started: float
    first: float
    done: float
    cpu_s: float
    peak_rss_mb: float

    @property
    def rate_steady(self) -> float:
        """Events per second from the first record folded to the last (start-up left out)."""
        return self.events / max(self.done - self.first, 1e-9)

    @property
    def rate_wall(self) -> float:
        """Events per second from the processes' start to the last record folded."""
        return self.events / max(self.done - self.started, 1e-9)


def _read(paths: Sequence[Path]) -> list[dict[str, dict[str, float] | float | None]]:
    out = []
    for path in paths:
        try:
            out.append(orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
    return out


def _done_at(
    reports: list[dict],  # type: ignore[type-arg]
    ends: Mapping[int, int],
    processes: int,
) -> float | None:
    """When the last partition was first seen at its end, or None while one is not.

    A bounded fold that emits its states at the end (Bytewax's ``fold_final``) reports
    ``done`` instead: the latest of its processes' once every process has.
    """
    dones = [d for r in reports if isinstance(d := r.get("done"), float | int)]
    if dones:
        return max(dones) if len(dones) >= processes else None
    latest = 0.0
    for partition, end in ends.items():
        if end <= 0:
            continue
        times = [r["reached"][str(partition)] for r in reports if str(partition) in r["reached"]]
        if not times:
            return None
        latest = max(latest, min(times))
    return latest


def measure(
    processes: Sequence[GroupProcess],
    progress: Sequence[Path],
    ends: Mapping[int, int],
    desc: str,
    *,
    ends_itself: bool = False,
    timeout_s: float = 1800.0,
    stop_grace_s: float = 30.0,
) -> Measured:
    """Start ``processes``, wait until the backlog's every partition is folded, stop them.

    An engine that ``ends_itself`` (a bounded job: Bytewax, Flink, refold's baseline) is given
    time to end and write its states; the others are stopped with SIGTERM and given
    ``stop_grace_s`` to exit (Kafka Streams dumps its store's states in its shutdown hook:
    half a million of them take longer than a process's usual grace).

    Raises:
        RuntimeError: A process failed, or the engine did not finish within ``timeout_s``.
    """
    print(f"{desc} ...", flush=True)
    started = time.time()
    for process in processes:
        process.start()
    usage = TreeUsage(tuple(p.pid for p in processes))
    sampled = 0.0
    try:
        while True:
            reports = _read(progress)
            done = _done_at(reports, ends, len(processes))
            if done is not None:
                break
            now = time.time()
            if now - sampled >= _SAMPLE_S:
                usage.sample(pss=False)
                sampled = now
            for process in processes:
                if process.returncode is not None and (
                    process.returncode != 0 or all(p.returncode is not None for p in processes)
                ):
                    reports = _read(progress)
                    if _done_at(reports, ends, len(processes)) is None:
                        msg = f"{desc}: a process exited early:\n{process.log_tail()}"
                        raise RuntimeError(msg)
            if now - started > timeout_s:
                msg = f"{desc}: not done after {timeout_s:.0f} s:\n{processes[0].log_tail()}"
                raise RuntimeError(msg)
            time.sleep(_POLL_S)
        usage.sample(pss=False)
    finally:
        if ends_itself:
            with contextlib.suppress(subprocess.TimeoutExpired):
                for process in processes:
                    process.wait(_END_S)
        for process in processes:  # all at once: one leaving makes the others rebalance
            if process.alive():
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.stop(stop_grace_s)
    firsts = [first for r in reports if isinstance(first := r.get("first"), float | int)]
    return Measured(
        events=sum(ends.values()),
        started=started,
        first=min(firsts) if firsts else started,
        done=done,
        cpu_s=usage.cpu_s,
        peak_rss_mb=usage.peak_rss_kb / 1024,
    )
