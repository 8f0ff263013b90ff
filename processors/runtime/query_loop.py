"""A generation's streaming query: built, watched (alias, Redis, lease, signals), then stopped."""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Literal, cast

from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.java_client import JavaClientConfigError
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.offsets_json import parse_offsets_json, to_offsets_json
from refold.contracts.layout import position_field
from refold.contracts.processors import (
    EventTime,
    consumer_group,
)
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.generations import (
    GenerationRegistry,
    Positions,
)
from refold.contracts.store.lease import GenerationLease
from refold.contracts.topics import TopicSpec, dead_letter_spec, effects_spec
from refold.processors.errors import REDIS_UNAVAILABLE, ProcessorConfigError
from refold.processors.fold.archive import ArchiveProcessor, is_archive_processor
from refold.processors.fold.dataframe import DataFrameProcessor, is_dataframe_processor
from refold.processors.fold.lookups import LookupFold
from refold.processors.fold.projection import Projection
from refold.processors.fold.windows import WindowFold, windows_topic
from refold.processors.runtime.archive_sink import ArchiveSink, prepare_archive, start_archive_query
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.checkpoints import (
    has_batches,
)
from refold.processors.runtime.dataframe import (
    DataFrameSink,
    build_dataframe_query,
)
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.runtime.run_plan import (
    ProcessorRun,
    RunOptions,
)
from refold.processors.runtime.sink import RedisFoldSink
from refold.processors.runtime.window_store import WindowCloser

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

logger = logging.getLogger(__name__)


Outcome = Literal["stopped", "caught_up", "retired", "behind", "vanished", "restart"]


# Spark 4.1.1's Kafka source (SPARK-55271, fixed in 4.1.3, whose connector jars Maven does not
# serve here yet) fails a query after the first batch it runs again from the checkpoint's
# offsets log (a crash mid-batch): reporting that batch's progress throws this NPE. The batch
# was applied and is in Spark's commit log by then, so the runner starts the query again.
_SPARK_55271 = 'the return value of "scala.Option.get()" is null'


SPARK_55271_RESTARTS = 3
# How long a caught-up run waits for its last micro-batch to end before stopping the query.
# The tasks commit to Redis (what the catch-up check sees) before the driver has collected
# their outcomes; a batch's tail after that is short (collect, group commit, Spark's commit log).
_FINISH_BATCH_S = 30.0


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
    if options.source_format.startswith("refold_kafka") and options.max_tasks:
        reader = reader.option("maxTasks", str(options.max_tasks))
    if options.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
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


def _planned_ends(query: StreamingQuery) -> Positions | None:
    """End offsets of the last completed micro-batch (Spark's progress), if there was one."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    reported = progress["sources"][0]["endOffset"]
    return None if reported is None else parse_offsets_json(reported, lenient=True)


class _CatchUp:
    """Decides when an ``available_now`` run has applied everything that was in the log at start.

    Done when every partition's applied position (Redis) reached the log end taken at start, a
    partition that had nothing to apply counting as done, or when Spark's progress reports an end
    offset at or past that log end on every partition (covers a restart from a checkpoint).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: list[TopicSpec],
        run: ProcessorRun,
        registry: GenerationRegistry,
    ) -> None:
        probe = LogOffsets(kafka.as_librdkafka())
        try:
            tps = [(t.name, p) for t in topics for p in probe.partitions(t.name)]
            self.target = probe.end_offsets(tps)
            log_start = probe.start_offsets(tps)
        finally:
            probe.close()
        self.registry = registry
        self.generation = run.generation
        applied, _batch = registry.positions(run.generation)
        if run.starting_offsets == "latest":
            first = dict(self.target)
        else:
            first = {**log_start, **parse_offsets_json(run.starting_offsets, lenient=True)}
        # Where applying starts per partition: what is applied already, else the first offset.
        self.start = {tp: applied.get(tp, first.get(tp, 0)) for tp in tps}

    def done(self, query: StreamingQuery) -> bool:
        positions, _batch = self.registry.positions(self.generation)
        behind = [tp for tp, end in self.target.items() if positions.get(tp, self.start[tp]) < end]
        if not behind:
            return True
        # A partition Redis has no position for (a generation from before starting positions
        # were recorded) is done when Spark's plan passed it; a low position is not (Redis lost
        # writes, which the watch repairs).
        planned = _planned_ends(query)
        return planned is not None and all(
            tp not in positions and planned.get(tp, -1) >= self.target[tp] for tp in behind
        )


def _log_progress(query: StreamingQuery, after: int) -> int:
    """Log Spark's phase timings of the batches since ``after`` (DEBUG); returns the last id."""
    if not logger.isEnabledFor(logging.DEBUG):
        return after
    for progress in query.recentProgress:
        if progress["batchId"] > after and progress["numInputRows"]:
            after = progress["batchId"]
            durations = ", ".join(f"{k} {v}" for k, v in sorted(progress["durationMs"].items()))
            logger.debug(
                "batch %d: %d rows; Spark phases (ms): %s",
                after,
                progress["numInputRows"],
                durations,
                extra={"batch_id": after},
            )
    return after


def run_generation(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    options: RunOptions,
    spark: SparkSession,
    run: ProcessorRun,
    registry: GenerationRegistry,
    lease: GenerationLease,
    following: bool,
    external_stop: threading.Event | None = None,
    started: threading.Event | None = None,
) -> Outcome:
    """Run one generation's query until a signal, the catch-up target, or a change in Redis.

    Returns ``retired`` when replay flipped readers to another generation, ``behind`` when
    Redis has lost writes that Spark's checkpoint has passed (the caller restarts a fold's
    query from Redis' positions; a DataFrame processor stops), ``vanished`` when the
    generation is gone from Redis.
    """
    dead_letters = dead_letter_spec(projection.name, run.target.dlq_topic)
    outputs = list(getattr(projection, "effect_topics", ()))
    closer: DriverTask | None = None
    if getattr(projection, "lookup", None):
        closer = _lookup_joiner(cast("LookupFold", projection), run, kafka)
    if getattr(projection, "windows", None):
        results_topic = options.windows_topic or windows_topic(projection.name)
        outputs.append(results_topic)
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
    if run.target.event_time is not None and run.target.event_time.late == "side-output":
        outputs.append(run.target.late_topic)
    # An output stream with a contract is declared by a contract set (its partitions and key);
    # any other output topic gets the side-effect defaults.
    declared = default_registry().topics
    effect_topics = [declared.get(t) or effects_spec(t) for t in outputs]
    ensure_topics(kafka.as_librdkafka(), [*topics, dead_letters])
    ensure_topics(kafka.as_librdkafka(), effect_topics, check_partitions=False)
    applied, _batch = registry.positions(run.generation)
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
    mirror = ConsumerGroupMirror(
        kafka.as_librdkafka(),
        consumer_group(projection.name, run.generation, run.target.layout.prefix),
    )
    # After a crash between the Redis commit and the group commit, the re-run batch skips
    # every record and commits nothing: mirror what Redis holds now, so lag tools agree.
    mirror.commit({position_field(t, p): o for (t, p), o in applied.items()})
    catch_up = _CatchUp(kafka, topics, run, registry) if options.available_now else None
    sink: RedisFoldSink | DataFrameSink | ArchiveSink
    if is_archive_processor(projection):
        archive = cast("ArchiveProcessor", projection)
        plan = prepare_archive(run.target, archive, EventCodec(), options.source_format)
        sink = ArchiveSink(plan, mirror, run.checkpoint)
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
        )
        query = build_query(spark, topics, kafka, run, sink, options)
    # The ranges source and Spark's kafka source (ranges from the offsets log) move a fold's
    # positions to each planned range's end; refold's record source leaves them at the last
    # record, below the end after a transaction marker. A DataFrame processor records the
    # batch's end offsets whatever the source.
    exact_ends = isinstance(sink, DataFrameSink) or options.source_format != "refold_kafka"
    watch = _RedisWatch(registry, run.generation, exact_ends)
    stop = external_stop or threading.Event()
    outcome: Outcome = "stopped"

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping the query after the current batch", signum)
        stop.set()

    previous_handlers = {}
    if external_stop is None and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, _on_signal)
    from pyspark.errors import StreamingQueryException

    logged_batch = -1
    try:
        while query.isActive and not stop.is_set():
            try:
                query.awaitTermination(1)
            except StreamingQueryException:
                break  # query.exception() below: raised, or a known Spark failure
            logged_batch = _log_progress(query, logged_batch)
            if closer is not None and closer.idle_rounds:
                closer.nudge()  # a lookup's table moves on its own; rounds coalesce
            if started is not None and query.lastProgress is not None:
                started.set()
            if lease.lost.is_set():
                msg = (
                    f"lost the lease of g{run.generation} (another processor took it over "
                    "after this one stalled); stopping"
                )
                raise ProcessorConfigError(msg)
            try:
                if catch_up is not None and catch_up.done(query):
                    logger.info("caught up with the log end taken at start; stopping")
                    outcome = "caught_up"
                    _finish_batch_in_flight(query)
                    break
                changed = watch.check(query, following)
            except REDIS_UNAVAILABLE as exc:
                watch.unreachable(exc)
                continue
            if changed is not None:
                outcome = changed
                break
    finally:
        if started is not None:
            started.set()
        if query.isActive:
            query.stop()
        if closer is not None:
            try:
                closer.stop()
            except Exception:  # the timers stay: the next run emits those windows
                logger.exception("closing the last windows failed; the next run emits them")
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        mirror.close()
    failure = query.exception()
    if failure is not None and outcome == "stopped":
        if options.source_format == "kafka" and _SPARK_55271 in str(failure):
            logger.warning(
                "g%d: Spark's Kafka source failed to report the progress of a batch it ran "
                "again from its checkpoint (SPARK-55271 of Spark 4.1.1); the batch is applied. "
                "Starting the query again",
                run.generation,
            )
            return "restart"
        raise failure
    if isinstance(sink, ArchiveSink):
        logger.info(
            "%s generation %d stopped: %s", projection.name, run.generation, sink.total.describe()
        )
        return outcome
    if isinstance(sink, DataFrameSink):
        logger.info(
            "%s generation %d stopped: %s", projection.name, run.generation, sink.total.describe()
        )
        return outcome
    logger.info(
        "%s generation %d stopped: %d records, %d applied, %d passed by (types it does not "
        "fold), %d rejected, %d undecodable",
        projection.name,
        run.generation,
        sink.total.records,
        sink.total.applied,
        sink.total.passed,
        sink.total.rejected,
        sink.total.undecodable,
    )
    return outcome


def _finish_batch_in_flight(query: StreamingQuery) -> None:
    """Wait (bounded) until no trigger is running, so that stopping interrupts no batch.

    Driver side. Stopping a query mid-batch interrupts its ``foreachBatch`` (a py4j
    InterruptedException trace in the log) and loses the batch's totals, its consumer group
    commit and its entry in Spark's commit log (the next run re-plans it; applied records
    are skipped, so the state is right either way).
    """
    deadline = time.monotonic() + _FINISH_BATCH_S
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)


class _RedisWatch:
    """Driver-side checks of the generation in Redis, between micro-batches.

    * retired: ``replay`` flipped readers to another generation (followers switch);
    * vanished: the generation is gone (Redis restarted empty);
    * behind: Redis' applied positions are below the end of the last completed batch, which
      only happens when Redis lost writes (failover, restore, lost fsync). With no new
      records the sink would never notice, so the query restarts from Redis' positions.
    """

    # Seconds between the behind checks (one HGETALL and Spark's last progress).
    _EVERY_S = 5.0

    def __init__(self, registry: GenerationRegistry, generation: int, exact_ends: bool):
        self.registry = registry
        self.generation = generation
        # Whether the applied positions reach each batch's planned end (else: no behind check).
        self.exact_ends = exact_ends
        self._next = time.monotonic() + self._EVERY_S
        self._down_since: float | None = None

    def unreachable(self, exc: Exception) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            logger.warning("Redis unreachable (%s); the query waits for it", exc)

    def check(self, query: StreamingQuery, following: bool) -> Outcome | None:
        status = self.registry.status(self.generation)
        if self._down_since is not None:
            logger.warning("Redis reachable again after %.1fs", time.monotonic() - self._down_since)
            self._down_since = None
        if status is None:
            logger.error("g%d vanished from Redis (restarted empty?)", self.generation)
            return "vanished"
        if following and status == "retired":
            logger.info(
                "g%d was retired (readers now see g%s); switching to the live generation",
                self.generation,
                self.registry.live(),
                extra={"generation": self.generation},
            )
            return "retired"
        if not self.exact_ends or time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + self._EVERY_S
        planned = _planned_ends(query)  # read first: positions only grow after it
        if planned is None:
            return None
        applied, _batch = self.registry.positions(self.generation)
        logger.debug("g%d: planned %s, applied %s", self.generation, planned, applied)
        behind = {
            tp: (applied.get(tp), end) for tp, end in planned.items() if applied.get(tp, -1) < end
        }
        if not behind:
            return None
        logger.error(
            "g%d: Redis has applied less than Spark's checkpoint says (%s); Redis lost writes "
            "(failover, restore, lost fsync?). Restarting the query from Redis' positions",
            self.generation,
            ", ".join(f"{t}/{p}: {a} < {e}" for (t, p), (a, e) in sorted(behind.items())[:5]),
        )
        return "behind"


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
