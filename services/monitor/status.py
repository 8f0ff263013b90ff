"""Processors, generations, lag, replay progress, stats and stalls: what the monitor reads.

Everything comes from Redis (the generations, their positions, leases and stats) and from the
broker (partitions, log ends, record timestamps, through :class:`LogProbe`), so every replica
of the services answers alike.

Stalls are sampled on demand, by the requests that read lag anyway (``/health``, ``/metrics``,
``/v1/processors/{p}/lag``), not by a background thread: positions only grow, so an unchanged
position between two samples proves it did not move in between (no false stall, whatever the
interval); a stall is reported at the first sample after ``stall_after_s`` instead of at once,
and whoever cares about stalls (a Prometheus scrape, a health probe) samples regularly anyway.
A thread would probe the broker from every replica and every worker process even when nobody
asks, and would need a lifecycle of its own.

Lifecycle: one :class:`Monitor` per app (the routes make it on first use), thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from refold.contracts.layout import StateLayout
from refold.contracts.processors import ProcessorSpec
from refold.contracts.registry import Registry, UnknownProcessorError, default_registry
from refold.contracts.store.generations import (
    GenerationRegistry,
    processors_in_redis,
    starting_positions,
)
from refold.contracts.store.positions import GenerationPositions
from refold.contracts.store.stats import BatchStats, ProcessorStats
from refold.services.api.context import ServiceContext
from refold.services.errors import NoLiveGenerationError
from refold.services.monitor.lag import LogProbe, StampKey
from refold.services.monitor.tracking import Progress, RateTracker, StallTracker, replay_progress
from refold.services.monitor.views import (
    GenerationLag,
    GenerationView,
    PartitionLag,
    ProcessorInfo,
    ReplayView,
    Stall,
    Watched,
)

__all__ = ["Monitor"]

# How long a request waits for the broker's lag answers before it answers without them:
# well inside Prometheus' default 10 s scrape timeout and a load balancer's probe timeout.
_LAG_BUDGET_S = 2.0
# Processors found in Redis (one SCAN over the keyspace) are listed again at most this often.
_NAMES_TTL_S = 30.0
# Trackers forget partitions and replays they have not sampled for this long.
_FORGET_AFTER_S = 3600.0


class Monitor:
    """Reads processors, generations, lag, replays, stats and stalls for one app.

    Args:
        context: The app's clients and settings.
        registry: The processors (default: the installed packages').
        budget_s: How long a request waits for the broker.
        wall: Epoch seconds (tests pass a fake); durations use the probe's monotonic clock.
    """

    def __init__(
        self,
        context: ServiceContext,
        registry: Registry | None = None,
        *,
        budget_s: float = _LAG_BUDGET_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = context.redis
        self.prefix = context.key_prefix
        self.probe = LogProbe(context.offsets)
        self.stalls = StallTracker(context.settings.serve.stall_after_s)
        self.rates = RateTracker()
        self.budget_s = budget_s
        self._registry = registry
        self._wall = wall
        self._names: tuple[float, list[str]] | None = None
        self._lock = threading.Lock()

    def deadline(self) -> float:
        """The broker deadline of a request starting now."""
        return time.monotonic() + self.budget_s

    # -- processors and generations ---------------------------------------------------------

    def registered(self) -> dict[str, ProcessorSpec]:
        """The processors installed packages register."""
        return (self._registry or default_registry()).processors

    def processor_names(self) -> list[str]:
        """Registered processors and those only found in Redis, sorted."""
        now = time.monotonic()
        with self._lock:
            if self._names is None or now - self._names[0] > _NAMES_TTL_S:
                self._names = (now, processors_in_redis(self.client, self.prefix))
            found = self._names[1]
        return sorted(set(self.registered()) | set(found))

    def processors(self) -> list[ProcessorInfo]:
        """Every processor (:meth:`processor_names`), less those gone since they were listed."""
        found = []
        for name in self.processor_names():
            try:
                found.append(self.processor(name))
            except UnknownProcessorError:
                continue  # removed from Redis since the names were cached
        return found

    def processor(self, name: str) -> ProcessorInfo:
        """A processor by name.

        Raises:
            UnknownProcessorError: Neither registered nor in Redis.
        """
        registry = self._registry or default_registry()
        if name not in registry.processors and self.client.exists(
            StateLayout(name, self.prefix).generations
        ):
            return ProcessorInfo(name, (), registered=False)
        return ProcessorInfo.of_spec(registry.processor(name))  # raises, naming the known ones

    def generations(self, info: ProcessorInfo) -> list[GenerationView]:
        """Every generation of a processor, oldest first, with positions and lease."""
        registry = GenerationRegistry.of(self.client, info.name, self.prefix)
        listed = registry.list()
        counts = []
        with self.client.pipeline(transaction=False) as pipe:
            for gen in listed:
                pipe.get(registry.keys(gen.generation).lease)
                counts.append(registry.positions_of(gen.generation).queue(pipe))
            answers = pipe.execute()
        views = []
        at = 0
        for gen, count in zip(listed, counts, strict=True):
            owner = cast("bytes | None", answers[at])
            replies, at = answers[at + 1 : at + 1 + count], at + 1 + count
            views.append(
                GenerationView(
                    info.name,
                    gen.generation,
                    gen.status,
                    gen.meta,
                    GenerationPositions.parse_replies(replies).positions,
                    owner is not None,
                    None if owner is None else owner.decode(errors="replace"),
                )
            )
        return views

    def live(self, info: ProcessorInfo) -> int | None:
        """The live generation of a processor."""
        return GenerationRegistry.of(self.client, info.name, self.prefix).live()

    def generation(self, info: ProcessorInfo, generation: int | None) -> GenerationView | None:
        """One generation (default the live one); None when it does not exist.

        Raises:
            NoLiveGenerationError: No generation asked and none is live.
        """
        if generation is None:
            generation = self.live(info)
            if generation is None:
                msg = f"{info.name} has no live generation yet"
                raise NoLiveGenerationError(msg)
        return next((v for v in self.generations(info) if v.generation == generation), None)

    def stats(self, info: ProcessorInfo, generations: Iterable[int]) -> dict[int, BatchStats]:
        """Processing stats of some generations of a processor."""
        return ProcessorStats(self.client, StateLayout(info.name, self.prefix)).read_many(
            generations
        )

    # -- lag ---------------------------------------------------------------------------------

    def lags(
        self,
        items: Sequence[tuple[ProcessorInfo, GenerationView]],
        deadline: float,
        *,
        seconds: bool = True,
    ) -> list[GenerationLag]:
        """Lag of several generations, with one round of questions to the broker.

        Args:
            items: The generations with their processors.
            deadline: When to answer with what is known (``time.monotonic()`` time).
            seconds: Also look up how long the first waiting record has waited.
        """
        topics = {t for info, view in items for t in view.topics(info.topics)}
        parts, ends = self.probe.ends(topics, deadline)
        rows: list[list[tuple[str, int, int, int | None]]] = []
        for info, view in items:
            # A partition without a position yet is where the generation started (or 0).
            at = {**starting_positions(view.meta), **view.positions}
            rows.append(
                [
                    (t, p, at.get((t, p), 0), ends.get((t, p)))
                    for t in view.topics(info.topics)
                    for p in parts.get(t, ())
                ]
            )
        wanted: list[StampKey] = [
            (t, p, pos) for row in rows for t, p, pos, end in row if end is not None and end > pos
        ]
        stamps = self.probe.timestamps(wanted, deadline) if seconds and wanted else {}
        now_ms = self._wall() * 1000
        result = []
        for (info, view), row in zip(items, rows, strict=True):
            partitions = []
            for t, p, pos, end in row:
                lag = None if end is None else max(0, end - pos)
                waited: float | None = 0.0 if lag == 0 else None
                if lag and (t, p, pos) in stamps:
                    stamp = stamps[t, p, pos]
                    waited = 0.0 if stamp is None else round(max(0.0, now_ms - stamp) / 1000, 3)
                partitions.append(PartitionLag(t, p, pos, end, lag, waited))
            complete = all(t in parts for t in view.topics(info.topics)) and all(
                r.end is not None for r in partitions
            )
            result.append(GenerationLag(info.name, view.generation, tuple(partitions), complete))
        return result

    # -- replays, stalls ----------------------------------------------------------------------

    def rate(self, view: GenerationView) -> float | None:
        """Records per second a generation applies: from samples, else its average so far."""
        applied = view.applied
        rate = self.rates.observe((view.processor, view.generation), applied)
        if rate is None and view.created_at is not None:
            age_s = self._wall() - view.created_at / 1000
            rate = applied / age_s if age_s > 0 and applied > 0 else None
        return None if rate is None else round(rate, 1)

    def replays(self, deadline: float) -> list[ReplayView]:
        """Every generation being built, with its progress to the log end."""
        items = [
            (info, view)
            for info in self.processors()
            for view in self.generations(info)
            if view.status == "building"
        ]
        lags = self.lags(items, deadline, seconds=False)
        return [
            ReplayView(view, self.progress(view, lag))
            for (_info, view), lag in zip(items, lags, strict=True)
        ]

    def progress(self, view: GenerationView, lag: GenerationLag) -> Progress | None:
        """How far a generation is from its start to the log end (None: ends unknown)."""
        rate = self.rate(view)  # sampled whether or not the broker answered
        if not lag.complete:
            return None
        ends = {(p.topic, p.partition): cast("int", p.end) for p in lag.partitions}
        return replay_progress(starting_positions(view.meta), view.positions, ends, rate)

    def watch(self, deadline: float) -> list[Watched]:
        """Lag and stalls of every generation that should be moving (samples the stalls)."""
        items = [
            (info, view)
            for info in self.processors()
            for view in self.generations(info)
            if view.status == "live" or (view.status == "building" and view.running)
        ]
        watched = []
        for (info, view), lag in zip(items, self.lags(items, deadline), strict=True):
            stalls = []
            for part in lag.partitions:
                if part.lag_records is None:
                    continue  # unknown: neither moving nor stalled
                key = (info.name, view.generation, part.topic, part.partition)
                waited = self.stalls.observe(key, part.position, part.lag_records)
                if self.stalls.is_stalled(waited):
                    stalls.append(
                        Stall(
                            info.name,
                            view.generation,
                            part.topic,
                            part.partition,
                            part.position,
                            part.end,
                            part.lag_records,
                            round(cast("float", waited), 1),
                        )
                    )
            watched.append(Watched(info, view, lag, tuple(stalls)))
        self.stalls.forget_older_than(_FORGET_AFTER_S)
        self.rates.forget_older_than(_FORGET_AFTER_S)
        return watched
