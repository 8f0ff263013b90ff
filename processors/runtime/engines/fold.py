"""The fold engines: a pure fold written to Redis by the task that reads its records.

One transaction per task and chunk (:class:`~refold.processors.runtime.envelope.FoldWriter`,
behind the ``foreachBatch`` sink :class:`~refold.processors.runtime.sink.RedisFoldSink`); what
the transaction writes is the fold's kind of state (``processors/runtime/kinds``). Three engines
share that path and differ in what the driver adds: :class:`FoldEngine` (entities, and kinds
added as modules), :class:`WindowFoldEngine` (a window closer, an event time required, the
windows described in the generation's meta) and :class:`LookupFoldEngine` (a lookup joiner,
never re-keyed with an event time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from refold.contracts.errors import RefoldError
from refold.contracts.processors import EventTime
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings
from refold.contracts.windows import window_meta
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.lookups import LookupFold
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying
from refold.processors.fold.windows import WindowFold, scales_of, windows_topic as _windows_topic
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.engines.base import Engine, QueryStart
from refold.processors.runtime.kinds import kind_of
from refold.processors.runtime.kinds.lookups import is_lookup_fold
from refold.processors.runtime.kinds.windows import is_window_fold
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.runtime.sink import RedisFoldSink
from refold.processors.runtime.window_store import WindowCloser

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from refold.processors.runtime.run_plan import ProcessorRun, RunOptions

__all__ = ["FoldEngine", "LookupFoldEngine", "WindowFoldEngine", "build_query"]


class FoldEngine(Engine):
    """Entities (and kinds of state added as modules): the engine of every other projection."""

    name = "fold"
    called = "an entity fold"
    keyed = True
    dedupes = True

    def matches(self, projection: Projection) -> bool:
        """Every projection: the last resort."""
        return True

    def state_kind(self, projection: Projection) -> str | None:
        """The first registered kind that accepts it (``kinds.kind_of``)."""
        return kind_of(projection)[0]

    def start(self, start: QueryStart) -> tuple[RedisFoldSink, StreamingQuery]:
        """Wire source -> the fold sink, whose tasks write Redis."""
        sink = RedisFoldSink(
            start.run.target,
            start.projection,
            start.mirror,
            closer=start.closer,
            checkpoint=start.run.checkpoint,
            closes_ranges=start.options.source_format == "kafka",
            tasks=start.task_plan(),
        )
        return sink, build_query(start, sink)

    def exact_ends(self, source_format: str) -> bool:
        """Not with refold's record source.

        The ranges source and Spark's kafka source (ranges from the offsets log) move a fold's
        positions to each planned range's end; refold's record source leaves them at the last
        record, below the end after a transaction marker.
        """
        return source_format != "refold_kafka"


class WindowFoldEngine(FoldEngine):
    """A fold that declares windows: closed by the driver on the watermark."""

    name = "windows"
    called = "a window fold"
    dedupes = False

    def matches(self, projection: Projection) -> bool:
        """A fold with ``windows``."""
        return is_window_fold(projection)

    def check_spec(
        self, projection: Projection, event_time: EventTime | None, keying: Keying | None
    ) -> None:
        """Refuse a spec without an event time."""
        if event_time is None:
            msg = (
                f"{projection.name} declares windows but its spec has no event_time. Operator "
                "action: add event_time=EventTime(field=...) to its ProcessorSpec."
            )
            raise ProcessorConfigError(msg)

    def generation_meta(self, projection: Projection) -> dict[str, str]:
        """The windows, which readers (the query API) build from it without the code."""
        windows = cast("WindowFold", projection).windows
        return window_meta(windows, getattr(projection, "distinct", ()), scales_of(projection))

    def result_topics(self, projection: Projection, windows_topic: str | None) -> list[str]:
        """The closed windows' topic: the option, else ``<processor>.windows``."""
        return [windows_topic or _windows_topic(projection.name)]

    def driver_task(
        self, projection: Projection, run: ProcessorRun, kafka: KafkaSettings, options: RunOptions
    ) -> DriverTask | None:
        """The window closer, which emits the windows the watermark closes."""
        event_time = cast("EventTime", run.target.event_time)
        return WindowCloser(
            run.target.layout,
            run.generation,
            cast("WindowFold", projection),
            event_time.lateness_ms,
            run.target.redis_url,
            kafka.as_librdkafka(),
            options.windows_topic or _windows_topic(projection.name),
        )


class LookupFoldEngine(FoldEngine):
    """A fold that declares a lookup: its events joined by the driver as of their time."""

    name = "lookups"
    called = "a lookup fold"
    dedupes = False

    def matches(self, projection: Projection) -> bool:
        """A fold with a ``lookup``."""
        return is_lookup_fold(projection)

    def check_spec(
        self, projection: Projection, event_time: EventTime | None, keying: Keying | None
    ) -> None:
        """Refuse a re-keyed lookup with an event time."""
        if event_time is None or keying is None or not keying.slots:
            return
        # Re-keyed with an event time: lateness is judged per source partition by every
        # writer slot (processors/runtime/lateness.py), and timers fire on each slot's
        # watermark over every partition (processors/fold/timers.py). A lookup fold keeps no
        # state per entity (its events wait in one pending set, scored by event time, and its
        # lookup_key picks the table row whatever the processor's key), so re-keying it would
        # only cost every slot a read of every record; it is not built, nor tested, re-keyed.
        msg = (
            f"{projection.name} has a lookup but is re-keyed ({keying.reason}). A lookup fold "
            "keeps no state per entity, and its lookup_key picks the table's row whatever the "
            "processor's key, so it needs no re-keying. Operator action: declare the topics' "
            "partition key as its key."
        )
        raise ProcessorConfigError(msg)

    def driver_task(
        self, projection: Projection, run: ProcessorRun, kafka: KafkaSettings, options: RunOptions
    ) -> DriverTask | None:
        """The lookup joiner, which joins the waiting events once their table is in."""
        return _lookup_joiner(cast("LookupFold", projection), run, kafka)


def build_query(start: QueryStart, sink: RedisFoldSink) -> StreamingQuery:
    """Wire source -> foreachBatch sink (no logic here)."""
    writer = (
        start.source()
        .writeStream.foreachBatch(sink)
        .queryName(f"{sink.target.processor}_g{start.run.generation}")
        .option("checkpointLocation", str(start.run.checkpoint))
    )
    # Always a processing-time trigger: under trigger(availableNow=True) PySpark 4.1 asks a Python
    # source for its latest offset only once, so with maxOffsetsPerTrigger the run would end after
    # the first capped batch. `available_now` is implemented by run_processor with a _CatchUp.
    return writer.trigger(processingTime=start.options.trigger_interval).start()


def _lookup_joiner(fold: LookupFold, run: ProcessorRun, kafka: KafkaSettings) -> LookupJoiner:
    """The driver task of a lookup processor; its table's processor must have an event time."""
    try:
        table_time = processor_spec(fold.lookup.processor).event_time
    except RefoldError as exc:
        msg = f"{fold.name} reads a table of {fold.lookup.processor}: {exc}"
        raise ProcessorConfigError(msg) from exc
    if table_time is None:
        msg = (
            f"{fold.name} reads {fold.lookup.processor}'s table as of each event's time, so "
            f"{fold.lookup.processor} needs an event time (its watermark says when every "
            "version valid at a time is in). Operator action: give its spec an event_time."
        )
        raise ProcessorConfigError(msg)
    return LookupJoiner(
        run.target.layout,
        run.generation,
        fold,
        cast("EventTime", run.target.event_time),
        table_time.lateness_ms,
        run.target.redis_url,
        kafka.as_librdkafka(),
        run.target.dlq_topic,
    )
