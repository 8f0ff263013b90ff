"""What the monitor reads, as values: processors, generations, lag, replays and stalls."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from refold.contracts.processors import ProcessorSpec
from refold.contracts.store.generations import (
    Positions,
    applied_records,
    describe_runner,
    starting_positions,
)
from refold.services.monitor.tracking import Progress

__all__ = [
    "GenerationLag",
    "GenerationView",
    "PartitionLag",
    "ProcessorInfo",
    "ReplayView",
    "Stall",
    "Watched",
]


@dataclass(frozen=True, slots=True)
class ProcessorInfo:
    """A processor: registered by an installed package, or only found in Redis."""

    name: str
    topics: tuple[str, ...]
    key: str = ""
    tables: tuple[str, ...] = ()
    aggregates: tuple[str, ...] = ()
    windows: tuple[str, ...] = ()
    description: str = ""
    registered: bool = True

    @classmethod
    def of_spec(cls, spec: ProcessorSpec) -> ProcessorInfo:
        """From a registered spec."""
        return cls(
            spec.name,
            spec.topics,
            spec.key,
            spec.tables,
            spec.aggregates,
            spec.windows,
            spec.description,
        )


@dataclass(frozen=True, slots=True)
class GenerationView:
    """One generation as the registry, its positions and its lease show it."""

    processor: str
    generation: int
    status: str
    meta: dict[str, str]
    positions: Positions
    running: bool
    lease_owner: str | None = None

    @property
    def runner(self) -> str:
        """Who folds it, in a few words (``describe_runner``, contracts/store/generations.py)."""
        return describe_runner(self.status, self.lease_owner, self.meta)

    @property
    def created_at(self) -> int | None:
        """Epoch ms of its creation."""
        value = self.meta.get("created_at")
        return int(value) if value and value.isdigit() else None

    @property
    def applied(self) -> int:
        """Records applied since it started."""
        return applied_records(self.positions, starting_positions(self.meta))

    @property
    def code_fingerprint(self) -> str:
        """The code fingerprint it was built with."""
        return self.meta.get("code_fingerprint", "")

    def topics(self, default: Sequence[str]) -> tuple[str, ...]:
        """The topics it folds: from its meta, else ``default`` (the spec's)."""
        try:
            found = json.loads(self.meta.get("topics", "[]"))
        except ValueError:
            found = []
        if isinstance(found, list) and found:
            return tuple(str(t) for t in found)
        return tuple(default)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition's lag (None: the broker did not answer in time)."""

    topic: str
    partition: int
    position: int
    end: int | None
    lag_records: int | None
    lag_seconds: float | None


@dataclass(frozen=True, slots=True)
class GenerationLag:
    """A generation's lag per partition; ``complete`` when the broker answered for all."""

    processor: str
    generation: int
    partitions: tuple[PartitionLag, ...]
    complete: bool

    @property
    def lag_records(self) -> int | None:
        """Records waiting over every partition (None when incomplete)."""
        if not self.complete:
            return None
        return sum(p.lag_records or 0 for p in self.partitions)

    @property
    def lag_seconds(self) -> float | None:
        """The oldest wait over every partition (None when incomplete or unknown)."""
        if not self.complete or any(p.lag_seconds is None for p in self.partitions):
            return None
        return max((p.lag_seconds or 0.0 for p in self.partitions), default=0.0)


@dataclass(frozen=True, slots=True)
class ReplayView:
    """A generation being built and how far it is (``progress`` None: log ends unknown)."""

    view: GenerationView
    progress: Progress | None


@dataclass(frozen=True, slots=True)
class Stall:
    """A partition whose records wait while its position does not move."""

    processor: str
    generation: int
    topic: str
    partition: int
    position: int
    end: int | None
    lag_records: int
    stalled_for_s: float


@dataclass(frozen=True, slots=True)
class Watched:
    """A generation that should be moving (live, or building with a processor on it)."""

    info: ProcessorInfo
    view: GenerationView
    lag: GenerationLag
    stalls: tuple[Stall, ...] = field(default=())
