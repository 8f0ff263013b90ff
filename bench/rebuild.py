"""Replay: rebuild throughput of a shadow generation, and the cutover as a reader sees it.

Runs ``replay --to-earliest --execute`` (the library calls behind it) over the backlog the Spark
catch-up run folded, while a reader thread resolves the live generation. The cutover a reader
sees is the gap between its last read of the old generation and its first read of the new one
(it reads every millisecond around the cutover, so the gap includes up to ~1 ms of its own
sleep); the flip itself is one Redis transaction. Until the rebuild reports that it caught up
the reader reads every 20 ms only: a thousand reads a second would take CPU from the rebuild
being measured, on a machine whose two cores are already busy.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from refold.contracts.processors import ProcessLauncher
from refold.contracts.progress import move_to, progress_bar
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import RebuildProgress, plan_replay, run_rebuild

__all__ = ["measure_rebuild"]

_READ_EVERY_S = 0.001  # around the cutover
_READ_SLOWLY_S = 0.02  # while the rebuild catches up


def measure_rebuild(
    bootstrap: str,
    redis_url: str,
    prefix: str,
    launcher: ProcessLauncher,
    state: Path,
    batch: int,
) -> dict[str, float]:
    """Rebuild ``prefix``'s order_state from the earliest offset; returns rates and timings.

    Args:
        bootstrap: Broker.
        redis_url: Redis.
        prefix: Key prefix of the generation the catch-up run built.
        launcher: How the rebuild's processor starts (topic names, source format).
        state: State directory (checkpoints, logs).
        batch: Records per micro-batch: the steady rate is measured after the first one.
    """
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    settings = RedisSettings(url=redis_url, key_prefix=prefix)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", prefix)
    spec = processor_spec("order_state")
    plan = plan_replay(spec, ToEarliest(), kafka, client, prefix, scan_limit=0)
    reads: list[tuple[float, int]] = []
    stop = threading.Event()
    near_cutover = threading.Event()

    def _read_alias() -> None:  # a reader resolving the live generation
        reader = redis_client(redis_url)
        while not stop.is_set():
            live = reader.get(registry.layout.alias)
            reads.append((time.perf_counter(), int(live or 0)))
            time.sleep(_READ_EVERY_S if near_cutover.is_set() else _READ_SLOWLY_S)

    samples: list[tuple[float, int]] = []
    thread = threading.Thread(target=_read_alias, daemon=True)
    thread.start()
    with progress_bar(total=plan.total_events, unit="ev", desc="rebuild") as bar:

        def _progress(progress: RebuildProgress) -> None:
            samples.append((time.monotonic(), progress.done))
            move_to(bar, progress.done)
            if progress.caught_up and not near_cutover.is_set():
                near_cutover.set()  # the flip follows this call: read every millisecond
                time.sleep(2 * _READ_SLOWLY_S)

        result = run_rebuild(
            plan,
            spec,
            kafka,
            settings,
            state_dir=state,
            on_progress=_progress,
            launcher=launcher,
        )
    stop.set()
    thread.join()
    old = [t for t, g in reads if g == result.previous]
    new = [t for t, g in reads if g == result.generation]
    gap_ms = (min(new) - max(old)) * 1000 if old and new else float("nan")
    after = [(t, d) for t, d in samples if d >= batch]
    steady = (
        (result.events - after[0][1]) / max(samples[-1][0] - after[0][0], 1e-9)
        if after and result.events > after[0][1]
        else 0.0
    )
    return {
        "events": result.events,
        "wall_s": result.seconds,
        "rate_wall": result.events / max(result.seconds, 1e-9),
        "rate_steady": steady,
        "flip_ms": result.flip_ms,
        "reader_gap_ms": gap_ms,
    }
