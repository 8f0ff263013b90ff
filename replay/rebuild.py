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

The shadow processor runs in a process group of its own, and SIGTERM or SIGINT to the replay
(``kill``, a CI timeout, a service manager, Ctrl-C) stops that group before the replay exits
(:mod:`refold.replay.interrupts`): the processor gets SIGTERM, finishes its batch and releases its
lease; what is left of its group after a grace period is killed. A ``kill -9`` of the replay
runs none of that: the processor notices that its parent is gone (``REFOLD_STOP_WITH_PARENT``)
and stops as on SIGTERM, and the replay's builder lease on the generation lapses, so status
shows the generation abandoned and ``replay gc`` removes it.

The shadow processor, the wait until it is caught up and the flip are
:mod:`refold.replay.shadow`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import redis

from refold.contracts.archive_coverage import ArchiveLedger, CoveredRanges
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorSpec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import (
    AS_OF_FIELD,
    ENDING_OFFSETS_FIELD,
    SHARDS_FIELD,
    GenerationRegistry,
    Positions,
)
from refold.contracts.store.lease import BuilderLease
from refold.contracts.store.stats import ProcessorStats
from refold.processors.runtime.checkpoints import (
    checkpoint_location,
    checkpoint_root,
    remove_stale_checkpoint,
)
from refold.replay.as_of import LogTimes, Until, UntilTime, bound_plan, check_moment, ending_offsets
from refold.replay.errors import PlanError, ReplayInterruptedError
from refold.replay.interrupts import InterruptedBySignalError, InterruptGuard
from refold.replay.plan import ReplayPlan, SeedPoint, build_plan
from refold.replay.reset_specs import TIME_SPECS, ResetSpec
from refold.replay.shadow import (
    Rebuilding,
    RebuildProgress,
    interrupted_message,
    log_path_of,
    start_processor,
)
from refold.replay.snapshots import Snapshot, SnapshotStore
from refold.replay.validate import (
    RebuildRate,
    decode_check,
    estimate_check,
    rebuild_rate_of,
    retention_check,
    scan_fingerprints,
    state_check,
)

__all__ = ["RebuildProgress", "RebuildResult", "plan_replay", "processor_topics", "run_rebuild"]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 30.0  # the processor finishes its micro-batch and releases its lease


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What a rebuild did."""

    generation: int
    previous: int | None
    events: int
    seconds: float
    flip_ms: float = 0.0  # the successful check-and-flip transaction
    as_of: str = ""  # a bounded rebuild (replay --until): the moment; kept, not flipped to


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


def _archived(
    root: Path | None, bounds: dict[tuple[str, int], tuple[int, int]]
) -> dict[tuple[str, int], CoveredRanges]:
    """What the archive covers of each partition whose log starts past offset 0."""
    if root is None:
        return {}
    ledger = ArchiveLedger(root, fsync=False)
    return {tp: ledger.read(*tp) for tp, (start, _end) in bounds.items() if start > 0}


def _log_times(offsets: LogOffsets, bounds: dict[tuple[str, int], tuple[int, int]]) -> LogTimes:
    """The timestamps of the first and the last record of the partitions (``--until``'s check)."""
    firsts, lasts = [], []
    for (topic, partition), (start, end) in bounds.items():
        if end <= start:
            continue
        first = offsets.record_timestamp(topic, partition, start)
        if first is not None:
            firsts.append(first[0])
        # The last offset may be a transaction marker: step back over a few.
        for offset in range(end - 1, max(start, end - 4) - 1, -1):
            last = offsets.record_timestamp(topic, partition, offset)
            if last is not None:
                lasts.append(last[0])
                break
    return LogTimes(min(firsts, default=None), max(lasts, default=None))


def _until_offsets(
    until: Until, offsets: LogOffsets, bounds: dict[tuple[str, int], tuple[int, int]]
) -> dict[tuple[str, int], int]:
    """Where a bounded rebuild stops on each partition (checks a time against the log first)."""
    if not isinstance(until, UntilTime):
        return ending_offsets(until, bounds)
    check_moment(until, _log_times(offsets, bounds), datetime.now(UTC))
    after = {tp: offsets.offset_at_time(tp[0], tp[1], until.after_ms) for tp in bounds}
    return ending_offsets(until, bounds, after)


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
    archive_root: Path | None = None,
    until: Until | None = None,
) -> ReplayPlan:
    """Gather log offsets and live positions, build the plan and validate it (reads only).

    Args:
        spec: The processor.
        reset: Where to start.
        kafka: Broker settings.
        client: Redis.
        key_prefix: Redis key prefix.
        scope: From :func:`refold.replay.plan.parse_scope`.
        allow_data_loss: Clamp targets below the log start instead of refusing.
        scan_limit: Records whose writer fingerprint is checked (0: no scan).
        accept_dead_letters: Unknown fingerprints and non-Avro records do not fail the plan.
        archive_root: The archive that serves offsets below the log start (the log's cold
            tier, ``StackSettings.cold_tier()``); None: none.
        until: Stop at a moment (``replay --until``): the plan is bounded there
            (:mod:`refold.replay.as_of`), and its rebuild is kept beside the live generation.

    Returns:
        The plan, seeded from the best snapshot when it needs one, with its checks.

    Raises:
        PlanError: See :func:`refold.replay.plan.build_plan`; also when offsets cannot be read,
            or the moment is in the future or before the first event.
    """
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    topics = processor_topics(spec, registry)
    offsets = LogOffsets(kafka.as_librdkafka())
    try:
        bounds = _bounds(offsets, topics)
        at_time: dict[tuple[str, int], int] = {}
        if isinstance(reset, TIME_SPECS):
            when_ms = int(reset.when.timestamp() * 1000)
            at_time = {tp: offsets.offset_at_time(tp[0], tp[1], when_ms) for tp in bounds}
        ends = _until_offsets(until, offsets, bounds) if until is not None else None
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
        archived=_archived(archive_root, bounds),
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
    if until is not None and ends is not None:
        plan = bound_plan(plan, until, ends)
    scan = scan_fingerprints(kafka.as_librdkafka(), plan, scan_limit)
    return plan.with_checks(
        (
            retention_check(plan),
            state_check(plan, spec.name),
            decode_check(scan, EventCodec(), accept_dead_letters=accept_dead_letters),
            estimate_check(plan, _measured_rate(registry)),
        )
    )


def _measured_rate(registry: GenerationRegistry) -> RebuildRate | None:
    """The rate of the newest generation whose rebuild was measured."""
    for info in reversed(registry.list()):
        rate = rebuild_rate_of(info.generation, info.meta)
        if rate is not None:
            return rate
    return None


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
    launcher: ProcessLauncher | None = None,
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
        launcher: How the rebuild's processor is started (the process contract: every
            setting, including the processor's own ``REFOLD_<PROCESSOR>__*`` options); default:
            ``kafka``, ``redis_settings`` and ``state_dir`` with default Spark settings and
            the processor's default options.

    Returns:
        The new generation, the previous live one, and timings.

    Raises:
        PlanError: The plan failed a check (see :func:`plan_replay`); nothing was changed.
        RebuildError: The processor failed or did not catch up in time; readers stay where
            they were, the shadow generation is left ``building`` for inspection.
        ReplayInterruptedError: SIGTERM or SIGINT arrived (main thread only): the processor
            and its process group were stopped first; readers stay where they were (unless
            the flip had already happened, which the message says); the shadow generation is
            left ``building``, its lease released (or held by a pid that is gone, which the
            next claimant takes over).
    """
    _refuse_unready(plan)
    client = redis_client(redis_settings.client_url())
    registry = GenerationRegistry.of(client, spec.name, redis_settings.key_prefix)
    store = SnapshotStore(registry)
    seed = store.get(plan.seed.generation, plan.seed.snapshot) if plan.seed is not None else None
    topics = sorted({row.topic for row in plan.partitions})
    starts = {(r.topic, r.partition): r.begin for r in plan.partitions}
    tps = list(starts)
    process: GroupProcess | None = None
    rebuilding: Rebuilding | None = None
    # SIGTERM and SIGINT raise from here on, so that the processor is stopped (below) before
    # replay exits; the alias is only ever changed by the flip, so readers stay where they were.
    with InterruptGuard() as guard:
        with guard.held():
            generation = _new_generation(registry, plan, topics)
            # Held until the flip or failure: a kill -9 of this replay leaves the generation
            # abandoned (status and gc tell), and its processor stops with this process.
            builder = BuilderLease(registry, generation)
            builder.acquire(0)
            offsets = LogOffsets(kafka.as_librdkafka())
        try:
            guard.check()
            launcher = launcher or ProcessLauncher(
                kafka, redis_settings, SparkSettings(), state_dir
            )
            _prepare(spec, generation, launcher, store, seed)
            log_path = log_path_of(state_dir, spec.name, generation)
            started = time.monotonic()
            with guard.held():
                process = start_processor(
                    spec,
                    plan,
                    generation,
                    launcher,
                    log_path,
                )
                guard.on_repeat = process.kill
            guard.check()
            target = offsets.end_offsets(tps)  # the log end when the rebuild began
            if plan.until:  # a bounded rebuild is done at its ending offsets
                target = {(r.topic, r.partition): r.end or 0 for r in plan.partitions}
            total = sum(max(0, target[tp] - starts[tp]) for tp in tps)
            logger.info(
                "g%d: rebuilding %d records (processor pid %d)",
                generation,
                total,
                process.pid,
                extra={"generation": generation},
            )
            rebuilding = Rebuilding(
                registry, generation, plan, process, log_path, offsets, starts, target, total
            )
            slack = 0 if plan.until else lag_threshold  # a bounded one stops exactly there
            rebuilding.until_flipped(guard, started, timeout_s, slack, on_progress)
            cutover_at = time.monotonic()
            # Read at the flip, before the processor's later (live) batches add to them.
            measured = _measure(registry, generation, starts)
        except InterruptedBySignalError:
            pass  # reported below, once the processor has stopped
        finally:
            guard.hold()  # a signal now waits for the stop; a second one kills the group
            if process is not None:
                process.stop(_STOP_GRACE_S)
            offsets.close()
            with contextlib.suppress(redis.RedisError):  # an unrenewed lease expires
                builder.release()
    if guard.signal_number is not None:
        msg = interrupted_message(
            guard.signal_number,
            generation,
            process,
            plan.live_generation,
            cut_over=rebuilding is not None and rebuilding.cut_over,
        )
        raise ReplayInterruptedError(msg, guard.signal_number)
    seconds = cutover_at - started
    applied = _record_rate(registry, generation, measured, seconds)
    # It flipped (or, bounded, was kept as of its moment): nothing else leaves the block above
    # without raising.
    flipped = cast("Rebuilding", rebuilding)
    return RebuildResult(
        generation, flipped.previous, applied, seconds, flipped.flip_ms, plan.until
    )


def _measure(registry: GenerationRegistry, generation: int, starts: Positions) -> tuple[int, float]:
    """Records applied since ``starts`` and seconds spent in micro-batches (processor's stats)."""
    positions = registry.positions(generation)[0]
    stats = ProcessorStats(registry.client, registry.layout).read(generation)
    applied = sum(max(0, positions.get(tp, s) - s) for tp, s in starts.items())
    return applied, stats.duration_sum_ms / 1000


def _record_rate(
    registry: GenerationRegistry,
    generation: int,
    measured: tuple[int, float],
    seconds: float,
) -> int:
    """Record what the rebuild applied and how long it took (the next plan's estimate).

    ``rebuild_seconds`` is the wall time from the processor's start to the flip,
    ``rebuild_batch_seconds`` the part of it in micro-batches: the estimate folds at
    ``rebuild_events / rebuild_batch_seconds`` after the rest as start-up
    (:class:`~refold.replay.validate.RebuildRate`). Returns the records applied.
    """
    applied, batch_seconds = measured
    registry.update_meta(
        generation,
        {
            "rebuild_events": str(applied),
            "rebuild_seconds": f"{seconds:.3f}",
            "rebuild_batch_seconds": f"{batch_seconds:.3f}",
        },
    )
    return applied


def _refuse_unready(plan: ReplayPlan) -> None:
    """Raise PlanError when the plan failed a check or would start past the log without state."""
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


def _new_generation(registry: GenerationRegistry, plan: ReplayPlan, topics: list[str]) -> int:
    """Create the generation the rebuild builds (``building``), with what it is made from."""
    return registry.create(
        {
            "replay_of": plan.live_generation if plan.live_generation is not None else "",
            "reset": plan.spec,
            "topics": topics,
            "starting_offsets": plan.starting_offsets(),
            "seeded_from": plan.seed.name if plan.seed is not None else "",
            # A bounded rebuild (replay --until): the moment and where it stops.
            **(
                {AS_OF_FIELD: plan.until, ENDING_OFFSETS_FIELD: plan.ending_offsets() or ""}
                if plan.until
                else {}
            ),
            # Undecided: its processor's first run shards it or not (run_plan).
            SHARDS_FIELD: "",
        }
    )


def _prepare(
    spec: ProcessorSpec,
    generation: int,
    launcher: ProcessLauncher,
    store: SnapshotStore,
    seed: Snapshot | None,
) -> None:
    """Remove a stale checkpoint of the generation, and seed it from the snapshot if any."""
    root = checkpoint_root(launcher.state_dir, launcher.spark, key_prefix=launcher.redis.key_prefix)
    remove_stale_checkpoint(checkpoint_location(root, spec.name, generation), launcher.spark)
    if seed is not None:
        copied = store.seed(seed, generation)
        logger.info("g%d seeded from %s (%d keys)", generation, seed.name, copied)
