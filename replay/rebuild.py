"""Run a replay plan: build a shadow generation, catch it up, flip readers to it (Kappa).

The live generation keeps serving, and its processor keeps processing new events, the whole
time. The shadow generation (seeded from a snapshot when the plan starts past the log start)
is built by the processor itself, started as a process (``python -m <module> --generation N
--starting-offsets <plan>``) with a fresh Spark checkpoint. It runs until it is caught up: on
every partition at or past the log end taken when the rebuild began *and* at or past what the
live generation has applied (less ``lag_threshold``). The check and the alias flip are one
optimistic Redis transaction, so readers never lose freshness and never see a mix.

Then the shadow processor stops; a live processor started with ``--generation live`` notices
that its generation was retired and continues the new one. The previous generation is kept
(retired) for ``replay rollback``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from contracts.codec import EventCodec
from contracts.generations import (
    GenerationRegistry,
    Positions,
    checkpoint_dir,
    checkpoint_root,
    remove_stale_checkpoint,
)
from contracts.offsets import LogOffsets
from contracts.processors import ProcessorSpec
from contracts.settings import KafkaSettings, RedisSettings
from contracts.state import StateLayout
from replay.errors import PlanError, RebuildError
from replay.plan import TIME_SPECS, ReplayPlan, ResetSpec, SeedPoint, build_plan
from replay.snapshots import SnapshotStore
from replay.validate import (
    REBUILD_STARTUP_S,
    decode_check,
    estimate_check,
    retention_check,
    scan_fingerprints,
    state_check,
)

__all__ = ["RebuildProgress", "RebuildResult", "plan_replay", "processor_topics", "run_rebuild"]

logger = logging.getLogger(__name__)

_POLL_S = 0.5  # progress refresh while the shadow processor runs


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What a rebuild did."""

    generation: int
    previous: int | None
    events: int
    seconds: float
    flip_ms: float = 0.0  # the successful check-and-flip transaction


def processor_topics(spec: ProcessorSpec, registry: GenerationRegistry) -> list[str]:
    """The topics the live generation was built from (its metadata), else the spec's."""
    live = registry.live()
    if live is not None:
        for info in registry.list():
            if info.generation == live and "topics" in info.meta:
                return list(json.loads(info.meta["topics"]))
    return list(spec.topics)


def _bounds(offsets: LogOffsets, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    tps = [(t, p) for t in topics for p in offsets.partitions(t)]
    starts = offsets.start_offsets(tps)
    ends = offsets.end_offsets(tps)
    return {tp: (starts[tp], ends[tp]) for tp in tps}


def plan_replay(
    spec: ProcessorSpec,
    reset: ResetSpec,
    kafka: KafkaSettings,
    client: redis.Redis,
    key_prefix: str,
    scope: dict[str, set[int] | None] | None = None,
    *,
    allow_data_loss: bool = False,
    scan_limit: int = 1_000_000,
    accept_dead_letters: bool = False,
) -> ReplayPlan:
    """Gather log offsets and live positions, build the plan and validate it (reads only).

    Args:
        spec: The processor.
        reset: Where to start.
        kafka: Broker settings.
        client: Redis.
        key_prefix: Redis key prefix.
        scope: From :func:`replay.plan.parse_scope`.
        allow_data_loss: Clamp targets below the log start instead of refusing.
        scan_limit: Records whose writer fingerprint is checked (0: no scan).
        accept_dead_letters: Unknown fingerprints and non-Avro records do not fail the plan.

    Returns:
        The plan, seeded from the best snapshot when it needs one, with its checks.

    Raises:
        PlanError: See :func:`replay.plan.build_plan`; also when offsets cannot be read.
    """
    registry = GenerationRegistry(client, StateLayout(spec.name, key_prefix))
    topics = processor_topics(spec, registry)
    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        bounds = _bounds(offsets, topics)
        at_time: dict[tuple[str, int], int] = {}
        if isinstance(reset, TIME_SPECS):
            when_ms = int(reset.when.timestamp() * 1000)
            at_time = {tp: offsets.offset_at_time(tp[0], tp[1], when_ms) for tp in bounds}
    except PlanError:
        raise
    except Exception as exc:
        msg = f"cannot read the offsets of {', '.join(topics)}: {exc}"
        raise PlanError(msg) from exc
    finally:
        offsets.close()
    live = registry.live()
    current: Positions = registry.positions(live)[0] if live is not None else {}
    plan = build_plan(
        spec.name,
        reset,
        bounds,
        current,
        live,
        scope,
        at_time=at_time,
        allow_data_loss=allow_data_loss,
    )
    if plan.needs_state:
        snapshot = SnapshotStore(registry).best_for(
            {(r.topic, r.partition): r.target for r in plan.partitions},
            {tp: start for tp, (start, _end) in bounds.items()},
        )
        if snapshot is not None:
            plan = plan.with_seed(
                SeedPoint(
                    snapshot.name,
                    snapshot.positions,
                    snapshot.created_at,
                    snapshot.generation,
                    snapshot.snapshot,
                )
            )
    scan = scan_fingerprints(kafka.as_librdkafka(), plan, scan_limit)
    rate, measured_by = _measured_rate(registry)
    return plan.with_checks(
        (
            retention_check(plan),
            state_check(plan, spec.name),
            decode_check(scan, EventCodec(), accept_dead_letters=accept_dead_letters),
            estimate_check(plan, rate, measured_by),
        )
    )


def _measured_rate(registry: GenerationRegistry) -> tuple[float | None, str]:
    """Records/s of the newest generation whose rebuild was measured."""
    for info in reversed(registry.list()):
        rate = info.meta.get("rebuild_rate")
        if rate:
            return float(rate), f"measured by the rebuild of g{info.generation}"
    return None, ""


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


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM (the processor finishes its batch and lets go of its lease), then SIGKILL."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_rebuild(
    plan: ReplayPlan,
    spec: ProcessorSpec,
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    *,
    state_dir: Path,
    lag_threshold: int = 0,
    timeout_s: float = 3600.0,
    on_progress: Callable[[RebuildProgress], None] | None = None,
    python: str = sys.executable,
) -> RebuildResult:
    """Build a new generation from ``plan`` and make it live.

    Args:
        plan: From :func:`plan_replay`; refused unless every check passed.
        spec: The processor.
        kafka: Broker settings (passed to the processor through its environment).
        redis_settings: Redis settings (likewise).
        state_dir: Where checkpoints and the shadow processor's log go.
        lag_threshold: Flip when at most this many records behind, per partition.
        timeout_s: Give up (readers stay where they are) after this long.
        on_progress: Called about twice a second.
        python: Interpreter for the processor process.

    Returns:
        The new generation, the previous live one, and timings.

    Raises:
        PlanError: The plan failed a check (see :func:`plan_replay`); nothing was changed.
        RebuildError: The processor failed or did not catch up in time; readers stay where
            they were, the shadow generation is left ``building`` for inspection.
    """
    failed = [c for c in plan.checks if not c.ok]
    if failed:
        msg = "the plan failed its checks, nothing was changed: " + "; ".join(
            f"{c.name}: {c.detail}. What to do: {c.action}" for c in failed
        )
        raise PlanError(msg)
    if plan.needs_state and plan.seed is None:
        msg = (
            "the plan starts past the log start but has no snapshot to start from; nothing "
            "was changed. Plan it with plan_replay(), or use --to-earliest."
        )
        raise PlanError(msg)
    client = redis.Redis.from_url(redis_settings.url)
    registry = GenerationRegistry(client, StateLayout(spec.name, redis_settings.key_prefix))
    store = SnapshotStore(registry)
    seed = store.get(plan.seed.generation, plan.seed.snapshot) if plan.seed is not None else None
    topics = sorted({row.topic for row in plan.partitions})
    generation = registry.create(
        {
            "replay_of": plan.live_generation if plan.live_generation is not None else "",
            "reset": plan.spec,
            "topics": topics,
            "starting_offsets": plan.starting_offsets(),
            "seeded_from": plan.seed.name if plan.seed is not None else "",
        }
    )
    remove_stale_checkpoint(checkpoint_dir(checkpoint_root(state_dir), spec.name, generation))
    if seed is not None:
        copied = store.seed(seed, generation)
        logger.info("g%d seeded from %s (%d keys)", generation, seed.name, copied)
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{spec.name}-g{generation}.log"
    env = {
        **os.environ,
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "REFOLD_REDIS__URL": redis_settings.url,
        "REFOLD_REDIS__KEY_PREFIX": redis_settings.key_prefix,
        "REFOLD_STATE_DIR": str(state_dir),
    }
    command = [
        python,
        "-m",
        spec.module,
        "--generation",
        str(generation),
        "--starting-offsets",
        plan.starting_offsets(),
    ]
    started = time.monotonic()
    starts = {(r.topic, r.partition): r.begin for r in plan.partitions}
    tps = list(starts)
    offsets = LogOffsets(kafka.as_librdkafka())
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            command, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        target = offsets.end_offsets(tps)  # the log end when the rebuild began
        total = sum(max(0, target[tp] - starts[tp]) for tp in tps)
        logger.info(
            "g%d: rebuilding %d records", generation, total, extra={"generation": generation}
        )
        ends, ends_at = dict(target), time.monotonic()
        while True:
            if process.poll() is not None:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                msg = (
                    f"the processor building g{generation} exited with {process.returncode}; "
                    f"readers stay on g{plan.live_generation}. Log {log_path} ends with:\n{tail}"
                )
                raise RebuildError(msg)
            if time.monotonic() - started > timeout_s:
                msg = (
                    f"g{generation} did not catch up within {timeout_s:.0f}s; readers stay on "
                    f"g{plan.live_generation}. Operator action: raise REFOLD_REPLAY_TIMEOUT_S "
                    "or REFOLD_LAG_THRESHOLD, or rerun when traffic is lower."
                )
                raise RebuildError(msg)
            positions = {
                tp: o for tp, o in registry.positions(generation)[0].items() if tp in starts
            }
            if time.monotonic() - ends_at > 2.0:
                ends, ends_at = offsets.end_offsets(tps, fresh=False), time.monotonic()
            reached = all(
                positions.get(tp, starts[tp]) + lag_threshold >= e for tp, e in target.items()
            )
            lag = {tp: max(0, ends[tp] - positions.get(tp, starts[tp])) for tp in tps}
            if on_progress is not None:
                on_progress(RebuildProgress(_done(positions, starts, target), total, lag, reached))
            if reached:
                flip_started = time.perf_counter()
                flipped, previous, _behind = registry.flip_if_caught_up(
                    generation, target, lag_threshold, starts=starts
                )
                if flipped:
                    flip_ms = (time.perf_counter() - flip_started) * 1000
                    break
            time.sleep(_POLL_S)
        cutover_at = time.monotonic()
    finally:
        _stop(process)
        offsets.close()
    positions = registry.positions(generation)[0]
    applied = sum(max(0, positions.get(tp, s) - s) for tp, s in starts.items())
    seconds = cutover_at - started
    registry.update_meta(
        generation,
        {
            "rebuild_events": str(applied),
            "rebuild_seconds": f"{seconds:.3f}",
            # Without the start-up, which the estimate adds back.
            "rebuild_rate": f"{applied / max(seconds - REBUILD_STARTUP_S, 1.0):.0f}",
        },
    )
    return RebuildResult(generation, previous, applied, seconds, flip_ms)
