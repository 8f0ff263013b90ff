"""The monitor's response bodies, as pydantic models (they document the API in OpenAPI)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from refold.contracts.store.stats import BatchStats
from refold.services.monitor.views import (
    GenerationLag,
    GenerationView,
    ProcessorInfo,
    ReplayView,
    Stall,
)

__all__ = [
    "DurationBucketModel",
    "DurationModel",
    "GenerationModel",
    "GenerationsResponse",
    "HealthResponse",
    "LagResponse",
    "LiveResponse",
    "PartitionLagModel",
    "ProcessorModel",
    "ProcessorsResponse",
    "ReplayModel",
    "ReplaysResponse",
    "StallModel",
    "StatsModel",
    "StatsResponse",
]


class GenerationModel(BaseModel):
    """One generation of a processor."""

    generation: int
    status: str = Field(description="building, live or retired")
    created_at: int | None = Field(description="epoch ms")
    live_since: int | None = Field(description="epoch ms it last became live")
    applied: int = Field(description="records applied since it started")
    lag_records: int | None = Field(
        description="records waiting after its positions; null when the broker did not answer"
    )
    code_fingerprint: str
    running: bool = Field(description="a processor holds its lease")
    runner: str = Field(
        description="who folds it: 'running on host:pid', 'not running', or 'waiting for code "
        "X (Y refused it)' when a processor running other code stopped rather than fold it"
    )

    @classmethod
    def of(cls, view: GenerationView, lag: GenerationLag | None) -> GenerationModel:
        """From a view and its lag."""
        live_since = view.meta.get("live_since", "")
        return cls(
            generation=view.generation,
            status=view.status,
            created_at=view.created_at,
            live_since=int(live_since) if live_since.isdigit() else None,
            applied=view.applied,
            lag_records=None if lag is None else lag.lag_records,
            code_fingerprint=view.code_fingerprint,
            running=view.running,
            runner=view.runner,
        )


class ProcessorModel(BaseModel):
    """A processor, its state kinds and its generations."""

    name: str
    description: str
    registered: bool = Field(description="false: found in Redis, no installed package has it")
    topics: list[str]
    key: str
    tables: list[str]
    aggregates: list[str]
    windows: list[str]
    live_generation: int | None
    generations: list[GenerationModel]

    @classmethod
    def of(
        cls, info: ProcessorInfo, live: int | None, generations: list[GenerationModel]
    ) -> ProcessorModel:
        """From a processor's info and its generations."""
        return cls(
            name=info.name,
            description=info.description,
            registered=info.registered,
            topics=list(info.topics),
            key=info.key,
            tables=list(info.tables),
            aggregates=list(info.aggregates),
            windows=list(info.windows),
            live_generation=live,
            generations=generations,
        )


class ProcessorsResponse(BaseModel):
    """``GET /v1/processors``."""

    processors: list[ProcessorModel]


class GenerationsResponse(BaseModel):
    """``GET /v1/processors/{name}/generations``."""

    processor: str
    generations: list[GenerationModel]


class PartitionLagModel(BaseModel):
    """One partition's lag."""

    topic: str
    partition: int
    position: int = Field(description="next offset the generation applies")
    end: int | None = Field(description="log end (next offset to be written)")
    lag_records: int | None
    lag_seconds: float | None = Field(
        description="how long the first record not applied has waited (0 when none waits)"
    )


class LagResponse(BaseModel):
    """``GET /v1/processors/{name}/lag``."""

    processor: str
    generation: int
    partitions: list[PartitionLagModel]
    lag_records: int | None = Field(description="over every partition")
    lag_seconds: float | None = Field(description="the oldest wait over every partition")

    @classmethod
    def of(cls, lag: GenerationLag) -> LagResponse:
        """From a generation's lag."""
        return cls(
            processor=lag.processor,
            generation=lag.generation,
            partitions=[
                PartitionLagModel(
                    topic=p.topic,
                    partition=p.partition,
                    position=p.position,
                    end=p.end,
                    lag_records=p.lag_records,
                    lag_seconds=p.lag_seconds,
                )
                for p in lag.partitions
            ],
            lag_records=lag.lag_records,
            lag_seconds=lag.lag_seconds,
        )


class DurationBucketModel(BaseModel):
    """Batches that took at most ``le_ms`` (cumulative)."""

    le_ms: float | None = Field(description="upper bound in ms; null: +Inf")
    count: int


class DurationModel(BaseModel):
    """Batch durations on the driver."""

    buckets: list[DurationBucketModel]
    sum_ms: int
    mean_ms: float | None


class StatsModel(BaseModel):
    """What a generation's micro-batches did."""

    generation: int
    status: str
    batches: int
    events: int = Field(description="records applied")
    duplicates: int = Field(description="records skipped as re-sent by their upstream")
    effects: int = Field(description="outputs produced")
    dead_letters: dict[str, int] = Field(description="dead letters by reason")
    dead_letters_total: int
    duration: DurationModel
    last_batch_id: int | None
    last_batch_at: int | None = Field(description="epoch ms")
    watermark_ms: int | None = Field(description="event-time watermark after the last batch")

    @classmethod
    def of(cls, generation: int, status: str, stats: BatchStats) -> StatsModel:
        """From parsed stats."""
        return cls(
            generation=generation,
            status=status,
            batches=stats.batches,
            events=stats.events,
            duplicates=stats.duplicates,
            effects=stats.effects,
            dead_letters=dict(stats.dead_letters),
            dead_letters_total=stats.dead_letters_total,
            duration=DurationModel(
                buckets=[
                    DurationBucketModel(le_ms=None if math.isinf(b) else b, count=n)
                    for b, n in stats.duration_buckets
                ],
                sum_ms=stats.duration_sum_ms,
                mean_ms=stats.mean_duration_ms,
            ),
            last_batch_id=stats.last_batch_id,
            last_batch_at=stats.last_batch_at,
            watermark_ms=stats.watermark_ms,
        )


class StatsResponse(BaseModel):
    """``GET /v1/processors/{name}/stats``."""

    processor: str
    generations: list[StatsModel]


class ReplayModel(BaseModel):
    """A generation being built and its progress (nulls: the broker did not answer)."""

    processor: str
    generation: int
    done: int | None = Field(description="records applied since its start")
    total: int | None = Field(description="records from its start to the log end now")
    percent: float | None
    rate: float | None = Field(description="records applied per second")
    eta_s: float | None = Field(description="seconds to the log end at that rate")
    started_at: int | None = Field(description="epoch ms")
    running: bool = Field(description="a processor holds its lease (false: left by a failure)")

    @classmethod
    def of(cls, replay: ReplayView) -> ReplayModel:
        """From a replay view."""
        view, progress = replay.view, replay.progress
        return cls(
            processor=view.processor,
            generation=view.generation,
            done=None if progress is None else progress.done,
            total=None if progress is None else progress.total,
            percent=None if progress is None else progress.percent,
            rate=None if progress is None else progress.rate,
            eta_s=None if progress is None else progress.eta_s,
            started_at=view.created_at,
            running=view.running,
        )


class ReplaysResponse(BaseModel):
    """``GET /v1/replays``."""

    replays: list[ReplayModel]


class StallModel(BaseModel):
    """A partition whose records wait while its position does not move."""

    processor: str
    generation: int
    topic: str
    partition: int
    position: int
    end: int | None
    lag_records: int
    stalled_for_s: float

    @classmethod
    def of(cls, stall: Stall) -> StallModel:
        """From a stall."""
        return cls(
            processor=stall.processor,
            generation=stall.generation,
            topic=stall.topic,
            partition=stall.partition,
            position=stall.position,
            end=stall.end,
            lag_records=stall.lag_records,
            stalled_for_s=stall.stalled_for_s,
        )


class HealthResponse(BaseModel):
    """``GET /health``: 200 ``ok``; 503 ``stalled`` (or ``unavailable``: Redis is down)."""

    status: Literal["ok", "stalled", "unavailable"]
    stalled: list[StallModel] = Field(default_factory=list)
    unknown: list[str] = Field(
        default_factory=list,
        description="<processor>/g<N> whose lag the broker did not tell in time",
    )
    stall_after_s: float
    error: str | None = None


class LiveResponse(BaseModel):
    """``GET /health/live``: the process answers."""

    status: Literal["ok"] = "ok"
