"""What an engine is to the runner, and the registry that picks a processor's engine.

An engine is how a processor's events become its results: the fold engines (entities and added
kinds of state, windows, lookups) write Redis in one transaction per task, the DataFrame engine
runs the user's Spark transform and upserts its rows from the driver, the archive writes Parquet
files. The runner, its start checks, the query's start and watch, the run plan, the output
topics and sharding ask the engine of a processor (:func:`engine_of`) what differs; they never
test the processor's type.

The questions, and who asks them:

- :attr:`Engine.keyed`: records go to entities owned by a task, so the processor may be re-keyed
  (runner: the keying plan);
- :meth:`Engine.state_kind`: its kind of state, or None (checks: ``state_ttl``; shards);
- :attr:`Engine.dedupes` and :attr:`Engine.called`: it applies ``dedupe=``, and how a refusal
  names it (checks);
- :meth:`Engine.check_spec`: its own rules on the spec's event time and keying (checks);
- :attr:`Engine.skips_markers`: it tells watermark markers apart itself, whatever the source
  (checks);
- :attr:`Engine.rebuilds_on_code_change`: a change of its code calls for a rebuild (runner, at
  start and when it follows a cutover);
- :attr:`Engine.state_in_checkpoint`: its state is in Spark's checkpoint, which Redis cannot
  replace (runner: a lost checkpoint, Redis behind);
- :attr:`Engine.reads_cold_tier`: its source reads below the log start from the archive (CLI);
- :meth:`Engine.generation_meta`: what the generation's meta records for readers (run plan);
- :meth:`Engine.result_topics`: the topics its results go to (output topics, ``refold topics``);
- :meth:`Engine.driver_task`: the task the driver runs beside the query (query start);
- :meth:`Engine.start`: the sink and the started query (query start);
- :meth:`Engine.exact_ends`: whether its positions reach each planned batch's end (query loop).

An engine is a subclass of :class:`Engine` that says which processors it runs
(:meth:`Engine.matches`). Engines added with :func:`register_engine` (``refold.extend``) are
asked first, then the built-in ones (archive, DataFrame, lookup fold, window fold, and last the
fold engine, which accepts every projection). This module stays light: the built-in engines,
which load the writers, are imported on first use.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Protocol

from refold.processors.fold.projection import Projection

if TYPE_CHECKING:
    # Types only: this module is light (an engine's package imports it without Spark), and
    # the run plan asks the registry, so it is imported after it.
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from refold.contracts.processors import EventTime
    from refold.contracts.settings import KafkaSettings
    from refold.contracts.topics import TopicSpec
    from refold.processors.fold.rekey import Keying
    from refold.processors.runtime.background import DriverTask
    from refold.processors.runtime.group_mirror import ConsumerGroupMirror
    from refold.processors.runtime.kafka_ranges import TaskPlan
    from refold.processors.runtime.run_plan import ProcessorRun, RunOptions

__all__ = [
    "Engine",
    "QueryStart",
    "RunningSink",
    "SinkTotal",
    "built_in_engines",
    "engine_of",
    "register_engine",
]


class SinkTotal(Protocol):
    """What a running sink has done since it started."""

    def describe(self) -> str:
        """One line for the log, once the query has stopped."""
        ...


class RunningSink(Protocol):
    """The ``foreachBatch`` function of a started query, as the query loop sees it."""

    @property
    def total(self) -> SinkTotal:
        """What it has done since it started."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class QueryStart:
    """Everything an engine starts a generation's query from (driver side).

    What an engine of a package uses (``refold.extend``): :attr:`projection`, :meth:`source`,
    :attr:`checkpoint`, :attr:`trigger_interval`, :attr:`query_name`, :attr:`generation` and
    :attr:`spark`. The other fields are the built-in engines' (the run's target in Redis, the
    consumer group mirror, the driver task) and may change.
    """

    projection: Projection
    topics: list[TopicSpec]
    kafka: KafkaSettings
    options: RunOptions
    spark: SparkSession
    run: ProcessorRun
    # The consumer group that mirrors the applied positions, for lag tools.
    mirror: ConsumerGroupMirror
    closer: DriverTask | None

    @property
    def generation(self) -> int:
        """The generation the query writes."""
        return self.run.generation

    @property
    def checkpoint(self) -> str:
        """Spark's checkpoint location of the query."""
        return str(self.run.checkpoint)

    @property
    def trigger_interval(self) -> str:
        """The query's processing-time trigger (``REFOLD_<PROCESSOR>__TRIGGER_INTERVAL``)."""
        return self.options.trigger_interval

    @property
    def query_name(self) -> str:
        """The streaming query's name: ``<processor>_g<generation>``."""
        return f"{self.projection.name}_g{self.run.generation}"

    def source(self) -> DataFrame:
        """The processor's source stream, from its run's starting offsets."""
        from refold.processors.runtime.engines.source import source_stream

        return source_stream(self.spark, self.topics, self.kafka, self.run, self.options)

    def task_plan(self) -> TaskPlan | None:
        """How refold's ranges source splits a batch into tasks, for a sink to plan them alike.

        The source's own grouping: :meth:`source` sets ``maxTasks`` and leaves
        ``minRecordsPerTask`` at its default, as :class:`TaskPlan` does. None for other sources.
        """
        from refold.processors.runtime.kafka_ranges import TaskPlan

        if self.options.source_format != "refold_kafka_ranges":
            return None
        return TaskPlan(max_tasks=self.options.max_tasks or None)


class Engine(abc.ABC):
    """How a processor runs: the answers that differ from one engine to another.

    An engine is a subclass that names itself, says which processors it runs
    (:meth:`matches`) and starts their query (:meth:`start`); every other answer has the default
    of an engine that writes no Redis state of refold's (no entities, no kind of state).

    Attributes:
        name: The engine's name (in the registry).
        called: How a refusal names a processor of this engine ("a DataFrame processor").
        keyed: Records go to entities owned by a task: the processor may be re-keyed.
        dedupes: It applies de-duplication by event id (``dedupe=``).
        skips_markers: It tells watermark markers apart itself, whatever the source.
        rebuilds_on_code_change: A change of its code calls for a rebuild (False: one lineage
            whatever the code, as the archive's files).
        state_in_checkpoint: Its state is in Spark's checkpoint (Spark's aggregation state),
            which Redis' positions cannot replace.
        reads_cold_tier: Its source reads below a partition's log start from the archive.
    """

    name: str = ""
    called: str = "a processor"
    keyed: bool = False
    dedupes: bool = False
    skips_markers: bool = False
    rebuilds_on_code_change: bool = True
    state_in_checkpoint: bool = False
    reads_cold_tier: bool = True

    @abc.abstractmethod
    def matches(self, projection: Projection) -> bool:
        """Whether ``projection`` runs on this engine."""

    @abc.abstractmethod
    def start(self, start: QueryStart) -> tuple[RunningSink, StreamingQuery]:
        """The sink and the started query of one generation (driver side)."""

    def state_kind(self, projection: Projection) -> str | None:
        """The kind of state it writes (``processors/runtime/kinds``), None without one."""
        return None

    def check_spec(
        self, projection: Projection, event_time: EventTime | None, keying: Keying | None
    ) -> None:
        """Refuse an event time or a keying this engine cannot apply (ProcessorConfigError)."""
        return None

    def generation_meta(self, projection: Projection) -> dict[str, str]:
        """What a generation's meta records for readers that run without the code."""
        return {}

    def result_topics(self, projection: Projection, windows_topic: str | None) -> list[str]:
        """The topics its own results go to (closed windows), besides side effects and letters.

        ``windows_topic``: the processor's ``windows_topic`` option (None: the default name).
        """
        return []

    def driver_task(
        self, projection: Projection, run: ProcessorRun, kafka: KafkaSettings, options: RunOptions
    ) -> DriverTask | None:
        """The task the driver runs beside the query (a window closer, a lookup joiner)."""
        return None

    def exact_ends(self, source_format: str) -> bool:
        """Whether the applied positions reach each planned batch's end with that source.

        Only then can the driver tell that Redis lost writes (positions below the end of the
        last completed batch). False: the engine moves no positions of refold's.
        """
        return False


# Engines added by register_engine, asked first (the latest added first); then the built-in
# ones, loaded on first use (they load the writers and Spark's helpers).
_ADDED: list[Engine] = []
_BUILT_IN: list[Engine] = []


def register_engine(engine: Engine) -> None:
    """Add an engine, asked before the built-in ones and before those added earlier.

    Adding a name again replaces that engine in place.
    """
    for index, known in enumerate(_ADDED):
        if known.name == engine.name:
            _ADDED[index] = engine
            return
    _ADDED.insert(0, engine)


def built_in_engines() -> list[Engine]:
    """The built-in engines, in the order they are asked: the fold engine last."""
    if not _BUILT_IN:
        from refold.processors.runtime.engines.archive import ArchiveEngine
        from refold.processors.runtime.engines.dataframe import DataFrameEngine
        from refold.processors.runtime.engines.fold import (
            FoldEngine,
            LookupFoldEngine,
            WindowFoldEngine,
        )

        # A lookup fold before a window fold, as the lookup kind is before the window kind.
        _BUILT_IN.extend(
            [
                ArchiveEngine(),
                DataFrameEngine(),
                LookupFoldEngine(),
                WindowFoldEngine(),
                FoldEngine(),
            ]
        )
    return _BUILT_IN


def engine_of(projection: Projection) -> Engine:
    """The engine ``projection`` runs on: the first, added then built in, that accepts it.

    Raises:
        LookupError: No engine accepts it (the fold engine accepts every projection).
    """
    for engine in [*_ADDED, *built_in_engines()]:
        if engine.matches(projection):
            return engine
    msg = f"no engine runs {type(projection).__name__}"
    raise LookupError(msg)
