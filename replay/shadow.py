"""The shadow generation of a rebuild: its processor, its progress, and the flip of readers.

:func:`start_processor` starts the processor that builds the generation (a process group of
its own); :class:`Rebuilding` follows its positions until it is caught up and flips readers to
it (:meth:`~refold.contracts.store.generations.GenerationRegistry.flip_if_caught_up`), reporting
:class:`RebuildProgress` on the way. :func:`~refold.replay.rebuild.run_rebuild` drives them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import STOP_WITH_PARENT_ENV, ProcessLauncher, ProcessorSpec
from refold.contracts.store.generations import GenerationRegistry, Positions
from refold.replay.errors import RebuildError
from refold.replay.interrupts import InterruptGuard
from refold.replay.plan import ReplayPlan

__all__ = [
    "RebuildProgress",
    "Rebuilding",
    "interrupted_message",
    "log_path_of",
    "start_processor",
]

_POLL_S = 0.5  # progress refresh while the shadow processor runs


@dataclass(frozen=True, slots=True)
class RebuildProgress:
    """Where a rebuild is, for progress bars.

    Attributes:
        done: Records folded since the plan's starting points.
        total: Records from the starting points to the log end taken at the start.
        lag: Per partition, records between the shadow's position and the log end now.
        caught_up: The shadow reached the rebuild's target; the flip is being attempted.
    """

    done: int
    total: int
    lag: dict[tuple[str, int], int]
    caught_up: bool = False


def _done(positions: Positions, starts: Positions, ends: Positions) -> int:
    """Records applied since the plan's starting points, up to ``ends``."""
    return sum(
        max(0, min(positions.get(tp, start), ends[tp]) - start) for tp, start in starts.items()
    )


def interrupted_message(
    signal_number: int,
    generation: int,
    process: GroupProcess | None,
    live_generation: int | None,
    *,
    cut_over: bool,
) -> str:
    """What an interrupted rebuild did and left, for :class:`ReplayInterruptedError`."""
    stopped = (
        f"stopped the rebuild processor of g{generation} (pid {process.pid} and its process group)"
        if process is not None
        else f"no processor had been started for g{generation}"
    )
    if cut_over:
        left = (
            f"the cutover had already happened: readers see g{generation} (`replay rollback` "
            "flips back)"
        )
        action = "none needed"
    else:
        readers = "no generation" if live_generation is None else f"g{live_generation}"
        left = (
            f"readers stay on {readers}; g{generation} is left building; a later replay "
            "creates a new generation"
        )
        action = "rerun the replay when it can run to the end"
    name = signal.Signals(signal_number).name
    return f"interrupted by {name}: {stopped}; {left}. Operator action: {action}."


@dataclass(slots=True)
class Rebuilding:
    """The shadow generation while its processor catches up, up to the flip.

    ``cut_over``, ``previous`` and ``flip_ms`` are set by the flip; the caller reads
    ``cut_over`` even when a signal interrupted it, to say whether readers moved.
    """

    registry: GenerationRegistry
    generation: int
    plan: ReplayPlan
    process: GroupProcess
    log_path: Path
    offsets: LogOffsets
    starts: Positions
    target: Positions  # the log end when the rebuild began
    total: int
    cut_over: bool = False
    previous: int | None = None
    flip_ms: float = 0.0

    def until_flipped(
        self,
        guard: InterruptGuard,
        started: float,
        timeout_s: float,
        lag_threshold: int,
        on_progress: Callable[[RebuildProgress], None] | None,
    ) -> None:
        """Report progress until the generation is caught up, then flip readers to it.

        A bounded rebuild (``replay --until``) is done at its ending offsets (``target``): the
        generation is marked ``as_of`` instead, and readers stay where they are.

        Raises:
            RebuildError: The processor exited, or did not catch up within ``timeout_s``.
        """
        tps = list(self.starts)
        ends, ends_at = dict(self.target), time.monotonic()
        bounded = bool(self.plan.until)
        while True:
            if not bounded:  # a bounded one's processor exits once there: positions first
                self._check_running(started, timeout_s)
            positions = {
                tp: o
                for tp, o in self.registry.positions(self.generation)[0].items()
                if tp in self.starts
            }
            if time.monotonic() - ends_at > 2.0:
                ends, ends_at = self.offsets.end_offsets(tps), time.monotonic()
            at = {tp: positions.get(tp, self.starts[tp]) for tp in tps}
            reached = all(at[tp] + lag_threshold >= e for tp, e in self.target.items())
            if on_progress is not None:
                lag = {tp: max(0, ends[tp] - at[tp]) for tp in tps}
                done = _done(positions, self.starts, self.target)
                on_progress(RebuildProgress(done, self.total, lag, reached))
            if reached and bounded:
                # State as of a moment: kept beside the live generation, never flipped to.
                with guard.held():
                    self.registry.keep_as_of(self.generation)
                return
            if bounded:
                self._check_running(started, timeout_s)
            if reached:
                flip_started = time.perf_counter()
                with guard.held():  # a signal now waits for the transaction's answer
                    self.cut_over, self.previous, _behind = self.registry.flip_if_caught_up(
                        self.generation, self.target, lag_threshold, starts=self.starts
                    )
                if self.cut_over:
                    self.flip_ms = (time.perf_counter() - flip_started) * 1000
                    return
                guard.check()
            time.sleep(_POLL_S)

    def _check_running(self, started: float, timeout_s: float) -> None:
        live = self.plan.live_generation
        if not self.process.alive():
            lines = self.log_path.read_text(errors="replace").splitlines()[-20:]
            msg = (
                f"the processor building g{self.generation} exited with "
                f"{self.process.returncode}; readers stay on g{live}. "
                f"Log {self.log_path} ends with:\n" + "\n".join(lines)
            )
            raise RebuildError(msg)
        if time.monotonic() - started > timeout_s:
            msg = (
                f"g{self.generation} did not catch up within {timeout_s:.0f}s; readers stay "
                f"on g{live}. Operator action: raise REFOLD_REPLAY_TIMEOUT_S or "
                "REFOLD_LAG_THRESHOLD, or rerun when traffic is lower."
            )
            raise RebuildError(msg)


def log_path_of(state_dir: Path, processor: str, generation: int) -> Path:
    """Where the rebuild's processor logs: ``<state_dir>/logs/<processor>-g<N>.log``."""
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{processor}-g{generation}.log"


def start_processor(
    spec: ProcessorSpec,
    plan: ReplayPlan,
    generation: int,
    launcher: ProcessLauncher,
    log_path: Path,
) -> GroupProcess:
    """Start ``python -m refold.processors NAME --generation N`` in a session and group of its own.

    Its own group: a Ctrl-C in replay's terminal reaches replay only, which stops the
    processor in order, and :meth:`GroupProcess.stop` ends the processor's JVM and workers.
    """
    # The processor stops when this replay is gone, even after a kill -9 (no finally here).
    env = {**launcher.env(), STOP_WITH_PARENT_ENV: str(os.getpid())}
    command = launcher.argv(
        [spec.name],
        generation=generation,
        starting_offsets=plan.starting_offsets(),
        ending_offsets=plan.ending_offsets(),
    )
    return GroupProcess(command, env, log_path).start()
