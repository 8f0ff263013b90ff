"""A generation's streaming query, started: its driver task, its topics, its sink and source.

:mod:`.query_loop` watches the query this module starts (alias, Redis, lease, signals).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.java_client import JavaClientConfigError
from refold.contracts.kafka.offsets_json import to_offsets_json
from refold.contracts.processors import EventTime
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.generations import Positions
from refold.contracts.topics import TopicSpec, dead_letter_spec
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.archive import ArchiveProcessor, is_archive_processor
from refold.processors.fold.dataframe import DataFrameProcessor, is_dataframe_processor
from refold.processors.fold.lookups import LookupFold
from refold.processors.fold.projection import Projection
from refold.processors.fold.windows import WindowFold, windows_topic
from refold.processors.runtime.archive_sink import ArchiveSink, prepare_archive, start_archive_query
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.checkpoints import has_batches
from refold.processors.runtime.dataframe import DataFrameSink, build_dataframe_query
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.kafka_ranges import TaskPlan
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.runtime.output_topics import output_topic_specs, output_topics
from refold.processors.runtime.run_plan import ProcessorRun, RunOptions
from refold.processors.runtime.sink import RedisFoldSink
from refold.processors.runtime.window_store import WindowCloser

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "Sink",
    "build_query",
    "driver_task",
    "ensure_generation_topics",
    "log_start",
    "start_query",
]

logger = logging.getLogger(__name__)

Sink = RedisFoldSink | DataFrameSink | ArchiveSink


def driver_task(
    projection: Projection, run: ProcessorRun, kafka: KafkaSettings, options: RunOptions
) -> tuple[DriverTask | None, list[str]]:
    """The fold's driver task (a window closer or a lookup joiner), and its output topics."""
    outputs = output_topics(projection, run.target.event_time, options.windows_topic)
    closer: DriverTask | None = None
    if getattr(projection, "lookup", None):
        closer = _lookup_joiner(cast("LookupFold", projection), run, kafka)
    if getattr(projection, "windows", None):
        results_topic = options.windows_topic or windows_topic(projection.name)
        event_time = cast("EventTime", run.target.event_time)
        closer = WindowCloser(
            run.target.layout,
            run.generation,
            cast("WindowFold", projection),
            event_time.lateness_ms,
            run.target.redis_url,
            kafka.as_librdkafka(),
            results_topic,
        )
    return closer, outputs


def ensure_generation_topics(
    kafka: KafkaSettings,
    projection: Projection,
    topics: list[TopicSpec],
    run: ProcessorRun,
    outputs: list[str],
) -> None:
    """Create the sources (checked), the dead-letter topic and the output topics if missing."""
    dead_letters = dead_letter_spec(projection.name, run.target.dlq_topic)
    effect_topics = output_topic_specs(outputs, default_registry().topics)
    ensure_topics(kafka.as_librdkafka(), [*topics, dead_letters])
    ensure_topics(kafka.as_librdkafka(), effect_topics, check_partitions=False)


def log_start(projection: Projection, run: ProcessorRun, applied: Positions) -> None:
    """Say where the generation starts: its checkpoint, or its starting offsets."""
    if has_batches(run.checkpoint):  # Spark resumes from it; the starting offsets are unused
        where = f"resuming from checkpoint {run.checkpoint}; applied in Redis: "
        where += to_offsets_json(applied) if applied else "nothing yet"
    else:
        where = f"checkpoint {run.checkpoint} (new), starting offsets {run.starting_offsets}"
    logger.info(
        "starting %s generation %d: %s",
        projection.name,
        run.generation,
        where,
        extra={"processor": projection.name, "generation": run.generation},
    )


def start_query(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    options: RunOptions,
    spark: SparkSession,
    run: ProcessorRun,
    mirror: ConsumerGroupMirror,
    closer: DriverTask | None,
) -> tuple[Sink, StreamingQuery]:
    """The sink of the processor's kind (archive, DataFrame or fold), and its started query."""
    sink: Sink
    if is_archive_processor(projection):
        archive = cast("ArchiveProcessor", projection)
        plan = prepare_archive(run.target, archive, EventCodec(), options.source_format)
        # The source's own grouping, as for a fold (below).
        sink = ArchiveSink(plan, mirror, run.checkpoint, _task_plan(options))
        query = start_archive_query(
            _source(spark, topics, kafka, run, options),
            sink,
            f"{projection.name}_g{run.generation}",
            run.checkpoint,
            options.trigger_interval,
        )
    elif is_dataframe_processor(projection):
        frames = cast("DataFrameProcessor", projection)
        sink = DataFrameSink(run.target, frames.table, run.checkpoint, mirror)
        query = build_dataframe_query(
            _source(spark, topics, kafka, run, options),
            frames,
            sink,
            f"{projection.name}_g{run.generation}",
            options.trigger_interval,
        )
    else:
        sink = RedisFoldSink(
            run.target,
            projection,
            mirror,
            closer=closer,
            checkpoint=run.checkpoint,
            closes_ranges=options.source_format == "kafka",
            tasks=_task_plan(options),
        )
        query = build_query(spark, topics, kafka, run, sink, options)
    return sink, query


def _task_plan(options: RunOptions) -> TaskPlan | None:
    """How refold's ranges source splits a batch into tasks, for a sink to plan them alike.

    The source's own grouping: :func:`_source` sets ``maxTasks`` and leaves
    ``minRecordsPerTask`` at its default, as :class:`TaskPlan` does. None for other sources.
    """
    if options.source_format != "refold_kafka_ranges":
        return None
    return TaskPlan(max_tasks=options.max_tasks or None)


def _source(
    spark: SparkSession,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    run: ProcessorRun,
    options: RunOptions,
) -> DataFrame:
    """The processor's source stream, from its run's starting offsets."""
    reader = (
        spark.readStream.format(options.source_format)
        .option("subscribe", ",".join(t.name for t in topics))
        .option("startingOffsets", run.starting_offsets)
        .option("failOnDataLoss", "true")
    )
    if options.source_format == "kafka":
        # Spark's source reads read_uncommitted by default: a processor's outputs are written
        # in transactions, and the records of an aborted one must not be folded.
        reader = reader.option("kafka.isolation.level", "read_committed")
    # Spark's JVM source takes Java client properties; refold's sources, librdkafka's.
    try:
        client = (
            kafka.as_java_client() if options.source_format == "kafka" else kafka.as_librdkafka()
        )
    except JavaClientConfigError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    for key, value in client.items():
        reader = reader.option(f"kafka.{key}", value)
    if options.source_format.startswith("refold_kafka") and options.archive_root:
        reader = reader.option("archiveRoot", options.archive_root)
    if options.source_format.startswith("refold_kafka") and options.max_tasks:
        reader = reader.option("maxTasks", str(options.max_tasks))
    if options.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
    if options.ending_offsets:
        if not options.source_format.startswith("refold_kafka"):
            msg = (
                "a run bounded by ending offsets (replay --until) needs refold's source: "
                f"Spark's {options.source_format!r} source has no endingOffsets for a stream"
            )
            raise ProcessorConfigError(msg)
        reader = reader.option("endingOffsets", options.ending_offsets)
    return reader.load()


def build_query(
    spark: SparkSession,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    run: ProcessorRun,
    sink: RedisFoldSink,
    options: RunOptions,
) -> StreamingQuery:
    """Wire source -> foreachBatch sink (no logic here)."""
    writer = (
        _source(spark, topics, kafka, run, options)
        .writeStream.foreachBatch(sink)
        .queryName(f"{sink.target.processor}_g{run.generation}")
        .option("checkpointLocation", str(run.checkpoint))
    )
    # Always a processing-time trigger: under trigger(availableNow=True) PySpark 4.1 asks a Python
    # source for its latest offset only once, so with maxOffsetsPerTrigger the run would end after
    # the first capped batch. `available_now` is implemented by run_processor with a _CatchUp.
    return writer.trigger(processingTime=options.trigger_interval).start()


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
