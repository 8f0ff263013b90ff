"""Run one processor generation as a Spark Structured Streaming query (driver side).

Shared by every processor's ``__main__``: resolves the generation, its checkpoint and starting
offsets, creates the dead-letter topic, starts the query and stops it cleanly on SIGTERM/SIGINT.

Starting offsets, in order of precedence:
1. the generation's Spark checkpoint, when it has one (Spark resumes from it);
2. the positions the generation has applied in Redis (a lost checkpoint is not a lost state);
3. ``--starting-offsets`` (``earliest``, ``latest`` or Spark's JSON form), default earliest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import redis

from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.java_client import JavaClientConfigError
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.offsets_json import parse_offsets_json, to_offsets_json
from refold.contracts.layout import position_field
from refold.contracts.processors import (
    EventId,
    EventTime,
    ProcessorSpec,
    SourceFormat,
    consumer_group,
)
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.generations import (
    CHECKPOINT_EPOCH_FIELD,
    RESET_PENDING_FIELD,
    SLOTS_FIELD,
    GenerationRegistry,
    Positions,
)
from refold.contracts.store.lease import GenerationLease
from refold.contracts.store.outage import wait_out_redis
from refold.contracts.topics import TopicSpec, dead_letter_spec, dead_letter_topic, effects_spec
from refold.contracts.windows import window_meta
from refold.processors.errors import REDIS_UNAVAILABLE, ProcessorConfigError, ProcessorError
from refold.processors.fold.archive import ArchiveProcessor, is_archive_processor
from refold.processors.fold.dataframe import DataFrameProcessor, is_dataframe_processor
from refold.processors.fold.lookups import LookupFold
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying, KeyingError, plan_keying
from refold.processors.fold.windows import WindowFold, scales_of, windows_topic
from refold.processors.runtime.archive_sink import ArchiveSink, prepare_archive, start_archive_query
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.checkpoints import (
    checkpoint_location,
    has_batches,
    remove_stale_checkpoint,
)
from refold.processors.runtime.code_identity import build_fingerprints, check_follow, check_resume
from refold.processors.runtime.dataframe import (
    DataFrameSink,
    build_dataframe_query,
    redis_behind_message,
    refuse_lost_checkpoint,
)
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.kafka_ranges import resolve_starting_offsets
from refold.processors.runtime.lookup_store import LookupJoiner
from refold.processors.runtime.sink import RedisFoldSink
from refold.processors.runtime.window_store import WindowCloser

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ProcessorJob",
    "ProcessorRun",
    "RunOptions",
    "consumer_group",
    "run_processor",
    "run_processors",
]

logger = logging.getLogger(__name__)

GenerationChoice = Literal["live", "new"] | int
_T = TypeVar("_T")
Outcome = Literal["stopped", "caught_up", "retired", "behind", "vanished", "restart"]

# Spark 4.1.1's Kafka source (SPARK-55271, fixed in 4.1.3, whose connector jars Maven does not
# serve here yet) fails a query after the first batch it runs again from the checkpoint's
# offsets log (a crash mid-batch): reporting that batch's progress throws this NPE. The batch
# was applied and is in Spark's commit log by then, so the runner starts the query again.
_SPARK_55271 = 'the return value of "scala.Option.get()" is null'
_SPARK_55271_RESTARTS = 3


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run a processor.

    Attributes:
        generation: ``live`` (the alias; the first run creates generation 1 and makes it live),
            ``new`` (a new building generation) or a generation number.
        checkpoint_root: Spark checkpoints live in ``<root>/<processor>/g<N>``: a path or a URL
            (:mod:`refold.processors.runtime.checkpoints`).
        starting_offsets: Used only when neither a checkpoint nor Redis positions exist.
        available_now: Process what is in the log at start, then stop (replay catch-up, batch
            runs); micro-batches still respect ``max_offsets_per_trigger``.
        trigger_interval: Processing-time trigger; keeps the idle ``latestOffset`` calls cheap.
        max_offsets_per_trigger: Cap on records per micro-batch (None: no cap).
        max_tasks: Spark tasks per micro-batch; on 2 cores fewer, larger tasks are faster.
        source_format: ``refold_kafka_ranges`` (the Python source planning offset ranges; each
            task reads its records in the worker that folds them), ``refold_kafka`` (the same
            source yielding records) or ``kafka`` (Spark's JVM source, where its jar exists).
        dead_letter_topic: Default ``<processor>.dlq``.
        windows_topic: Where closed windows go; default ``<processor>.windows``.
        accept_code_change: Resume a generation whose code fingerprint differs (and record
            the new one) instead of refusing.
        lease_wait_s: How long a start waits for another processor to let go of the
            generation (e.g. replay's processor finishing its last batch after a cutover).
    """

    generation: GenerationChoice = "live"
    checkpoint_root: str | Path = ".state/checkpoints"
    starting_offsets: str = "earliest"
    available_now: bool = False
    trigger_interval: str = "250 milliseconds"
    max_offsets_per_trigger: int | None = 200_000
    max_tasks: int | None = 2
    source_format: SourceFormat = "refold_kafka_ranges"
    dead_letter_topic: str | None = None
    windows_topic: str | None = None
    accept_code_change: bool = False
    # A processor stopping after a cutover finishes its micro-batch first (SIGTERM), which
    # takes seconds; two minutes also covers a slow batch without hiding a real duplicate.
    lease_wait_s: float = 120.0


@dataclass(frozen=True, slots=True)
class ProcessorJob:
    """One processor query to run: its spec, its fold, its topics and how to run it."""

    spec: ProcessorSpec
    projection: Projection
    topics: list[TopicSpec]
    options: RunOptions


@dataclass(frozen=True, slots=True)
class ProcessorRun:
    """A resolved run: which generation, where its checkpoint is, where it starts."""

    generation: int
    checkpoint: str
    starting_offsets: str
    target: FoldTarget


def resolve_run(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    options: RunOptions,
    client: redis.Redis,
    keying: Keying | None = None,
    event_time: EventTime | None = None,
    dedupe: EventId | None = None,
) -> ProcessorRun:
    """Pick the generation, checkpoint and starting offsets (creating the generation if asked)."""
    registry = GenerationRegistry.of(client, projection.name, redis_settings.key_prefix)
    fingerprints = build_fingerprints(projection)
    meta = {
        "topics": [t.name for t in topics],
        "starting_offsets": options.starting_offsets,
        SLOTS_FIELD: str(keying.slots if keying else 0),
        **fingerprints,
    }
    created = False
    if options.generation == "live":
        live = registry.live()
        if live is None:
            generation, created = registry.create(meta, live=True), True
        else:
            generation = live
    elif options.generation == "new":
        generation, created = registry.create(meta), True
    else:
        generation = options.generation
        if registry.status(generation) is None:
            msg = f"{projection.name} has no generation {generation}; see `replay status`"
            raise ProcessorConfigError(msg)
    if not created:
        pending = registry.meta(generation).get(RESET_PENDING_FIELD)
        if pending:
            msg = (
                f"{projection.name} g{generation} is half reset: an in-place reset ({pending}) "
                "did not finish. Operator action: run that `replay --in-place --execute` "
                "again, or rebuild online and flip to the new generation."
            )
            raise ProcessorConfigError(msg)
        check_resume(registry, projection, generation, options.accept_code_change)
    windows = getattr(projection, "windows", None)
    if windows:  # readers (the query API) build the windows from it, without the code
        described = window_meta(windows, getattr(projection, "distinct", ()), scales_of(projection))
        registry.update_meta(generation, described)
    epoch = int(registry.meta(generation).get(CHECKPOINT_EPOCH_FIELD, "0"))
    checkpoint = checkpoint_location(
        str(options.checkpoint_root), projection.name, generation, epoch
    )
    if created:
        remove_stale_checkpoint(checkpoint)
    starting = options.starting_offsets
    if not has_batches(checkpoint):
        positions, _ = registry.positions(generation)
        if positions:
            starting = to_offsets_json(positions)
            logger.info("no checkpoint: resuming g%d from its Redis positions", generation)
    target = FoldTarget(
        processor=projection.name,
        generation=generation,
        code_fingerprint=fingerprints["code_fingerprint"],
        created_at=registry.meta(generation).get("created_at", ""),
        redis_url=redis_settings.client_url(),
        key_prefix=redis_settings.key_prefix,
        kafka=tuple(sorted(kafka.as_librdkafka().items())),
        dlq_topic=dead_letter_topic(projection.name, options.dead_letter_topic),
        event_time=event_time,
        dedupe=dedupe,
        topics=tuple(t.name for t in topics),
        **_keying_fields(registry, generation, keying),
    )
    return ProcessorRun(generation, checkpoint, starting, target)


def _keying_fields(
    registry: GenerationRegistry, generation: int, keying: Keying | None
) -> dict[str, Any]:
    """The target's keying: a generation's writer slots never change once it has some."""
    if keying is None:
        return {}
    slots = keying.slots
    recorded = registry.meta(generation).get(SLOTS_FIELD)
    if recorded is None:
        registry.update_meta(generation, {SLOTS_FIELD: str(slots)})
    elif int(recorded) != slots:
        logger.warning(
            "g%d was built with %s writer slots; keeping them (not %d): an entity's slot must "
            "not change within a generation",
            generation,
            recorded,
            slots,
        )
        slots = int(recorded)
    if not slots and keying.slots:
        msg = (
            f"g{generation} was built co-partitioned, but its topics are not any more "
            f"({keying.reason}). Operator action: rebuild it with replay --to-earliest --execute."
        )
        raise ProcessorConfigError(msg)
    return {
        "slots": slots,
        "key_field": keying.key_field,
        "key_links": keying.via,
        "partition_keys": keying.partition_keys,
    }


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


def run_processor(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    options: RunOptions,
    spark: SparkSession | None = None,
    stop: threading.Event | None = None,
    spec: ProcessorSpec | None = None,
    started: threading.Event | None = None,
) -> int:
    """Run until stopped (SIGTERM/SIGINT, or ``stop``) or, with ``available_now``, caught up.

    With ``generation="live"`` the processor follows the live alias: when ``replay`` cuts
    readers over to a rebuilt generation, this one is retired, and the processor stops its
    query and continues the new live generation (from its checkpoint or Redis positions) as
    soon as the rebuild's own processor has let go of it.

    Args:
        projection: The fold.
        topics: Its topics.
        kafka: Broker settings.
        redis_settings: Redis settings.
        options: How to run.
        spark: The application's session (default: a new one).
        stop: Set to stop (several processors in one application share one).
        spec: The processor's spec: its key decides whether it is re-keyed (checked against
            the broker's partition counts at start). None: entities are owned by partitions.
        started: Set once its query has completed a first micro-batch (or has stopped).

    Returns:
        The generation that ran last.
    """
    # A DataFrame processor's rows are written by the driver, one transaction per batch: its
    # entities need no owner task, so it is never re-keyed.
    dataframe = is_dataframe_processor(projection)
    # An archive has no entities (each task archives its own partitions) and is one lineage of
    # files: code and schema changes never call for a rebuild (new files get the new columns;
    # `refold archive backfill` rewrites old dates).
    archive = is_archive_processor(projection)
    if archive:
        options = dataclasses.replace(options, accept_code_change=True)
    keying = (
        None if spec is None or dataframe or archive else _plan_keying(spec, topics, kafka, options)
    )
    event_time = None if spec is None else spec.event_time
    _check_event_time(projection, event_time, keying)
    dedupe = None if spec is None else spec.dedupe
    _check_dedupe(projection, dedupe)
    client = redis.Redis.from_url(redis_settings.client_url())
    who = f"the processor {projection.name}"
    registry = GenerationRegistry.of(client, projection.name, redis_settings.key_prefix)
    following = options.generation == "live" and not options.available_now
    wait_s = options.lease_wait_s
    restarts = 0
    while True:
        picked = _until_redis_answers(
            functools.partial(
                resolve_run,
                projection,
                topics,
                kafka,
                redis_settings,
                options,
                client,
                keying,
                event_time,
                dedupe=dedupe,
            ),
            redis_settings,
            client,
            who,
        )
        lease = GenerationLease(registry, picked.generation)
        lease.acquire(wait_s)
        try:
            # Resolved again under the lease: while it waited, the previous holder went on
            # committing, and an in-place reset may have moved the checkpoint epoch.
            exact = dataclasses.replace(options, generation=picked.generation)
            run = resolve_run(
                projection,
                topics,
                kafka,
                redis_settings,
                exact,
                client,
                keying,
                event_time,
                dedupe=dedupe,
            )
            if options.generation == "live" and registry.live() != run.generation:
                logger.info("g%d is no longer live; picking again", run.generation)
                continue
            if dataframe:
                refuse_lost_checkpoint(
                    projection.name,
                    run.generation,
                    has_batches(run.checkpoint),
                    registry.positions(run.generation)[1],
                )
            run = _record_starting_positions(run, registry, kafka, topics)
            if spark is None:
                from refold.processors.runtime.spark import (
                    build_spark_session,
                    check_kafka_connector,
                )

                if options.source_format == "kafka":
                    check_kafka_connector(SparkSettings())
                spark = build_spark_session(
                    f"refold-{projection.name}-g{run.generation}", SparkSettings()
                )
            outcome = _run_generation(
                projection,
                topics,
                kafka,
                options,
                spark,
                run,
                registry,
                lease,
                following,
                stop,
                started,
            )
        finally:
            with contextlib.suppress(*REDIS_UNAVAILABLE):  # an expired lease frees itself
                lease.release()
        if outcome in ("stopped", "caught_up"):
            return run.generation
        if outcome == "retired":
            live = _until_redis_answers(registry.live, redis_settings, client, who)
            if live is not None and not archive:
                # Raises when the new live generation was built by other code: this process
                # stops rather than fold it with its old code (an accepted change at start
                # was for the generation it started on, not for a later rebuild's).
                _until_redis_answers(
                    functools.partial(check_follow, registry, projection, run.generation, live),
                    redis_settings,
                    client,
                    who,
                )
                options = dataclasses.replace(options, accept_code_change=False)
            # The rebuild's processor still holds the new generation until it has stopped.
            wait_s = 300.0
        elif outcome == "behind":
            if dataframe:  # its state is in Spark's checkpoint, past what Redis lost
                raise ProcessorConfigError(redis_behind_message(projection.name, run.generation))
            # Redis lost writes Spark's checkpoint has passed: plan from Redis' positions.
            remove_stale_checkpoint(run.checkpoint)
            wait_s = options.lease_wait_s
        elif outcome == "restart":
            restarts += 1
            if restarts > _SPARK_55271_RESTARTS:
                msg = (
                    f"{projection.name}: Spark's Kafka source failed {restarts} times (SPARK-55271)"
                )
                raise ProcessorError(msg)
            wait_s = options.lease_wait_s
        elif outcome == "vanished":
            if not following:
                msg = (
                    f"{projection.name} g{run.generation} vanished from Redis (restarted "
                    "empty?). Operator action: rebuild it with `replay --processor "
                    f"{projection.name} --to-earliest --execute`, or run the processor with "
                    "--generation live to start over from the log."
                )
                raise ProcessorConfigError(msg)
            remove_stale_checkpoint(run.checkpoint)
            wait_s = options.lease_wait_s


# A processor starting while Redis is away waits this long for it before giving up.
_REDIS_START_WAIT_S = 300.0


def _until_redis_answers(
    call: Callable[[], _T], redis_settings: RedisSettings, client: redis.Redis, who: str
) -> _T:
    """Run ``call``, waiting (bounded) while Redis is unreachable.

    Raises:
        RedisCredentialsError: Redis refused ``client``'s login (``who`` in the message).
        ProcessorConfigError: Redis did not answer within the start budget.
    """

    def give_up(_waited: float, exc: Exception) -> ProcessorConfigError:
        return ProcessorConfigError(
            f"Redis at {redis_settings.url} unreachable for {_REDIS_START_WAIT_S:.0f}s: {exc}. "
            "Operator action: start Redis, or fix REFOLD_REDIS__URL."
        )

    return wait_out_redis(
        call, who, client, give_up, patience_s=_REDIS_START_WAIT_S, first_delay_s=0.5
    )


def _record_starting_positions(
    run: ProcessorRun, registry: GenerationRegistry, kafka: KafkaSettings, topics: list[TopicSpec]
) -> ProcessorRun:
    """Before a generation's first batch, record where it starts as its applied positions.

    From then on every partition has a position in Redis, so a position that is missing or
    lower than Spark's plan can only mean Redis lost writes, and the sink folds the gap again
    (DESIGN.md decision 9). The source is given the same concrete offsets.
    """
    if has_batches(run.checkpoint) or registry.positions(run.generation)[0]:
        return run
    probe = LogOffsets(kafka.as_librdkafka())
    try:
        resolved = resolve_starting_offsets(probe, [t.name for t in topics], run.starting_offsets)
    except ValueError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    finally:
        probe.close()
    keys = registry.keys(run.generation)
    with registry.client.pipeline(transaction=True) as pipe:
        for (topic, partition), offset in sorted(resolved.items()):
            field_name = position_field(topic, partition)
            pipe.hsetnx(keys.positions, field_name, str(offset))
            pipe.set(keys.guard(field_name), offset, nx=True)
            for slot in range(run.target.slots):  # re-keyed: every writer slot starts there
                pipe.hsetnx(keys.slot_positions(slot), field_name, str(offset))
        pipe.execute()
    starting = to_offsets_json(registry.positions(run.generation)[0])
    logger.info("g%d starts at %s", run.generation, starting)
    return dataclasses.replace(run, starting_offsets=starting)


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


def _run_generation(
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
        kafka.as_librdkafka(), consumer_group(projection.name, run.generation)
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


# How long an application waits for one query's first micro-batch before starting the next.
_FIRST_BATCH_WAIT_S = 120.0
# How long a caught-up run waits for its last micro-batch to end before stopping the query.
# The tasks commit to Redis (what the catch-up check sees) before the driver has collected
# their outcomes; a batch's tail after that is short (collect, group commit, Spark's commit log).
_FINISH_BATCH_S = 30.0


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


def _plan_keying(
    spec: ProcessorSpec, topics: list[TopicSpec], kafka: KafkaSettings, options: RunOptions
) -> Keying:
    """Co-partitioned or re-keyed, from the topics as the broker has them (created if missing)."""
    ensure_topics(kafka.as_librdkafka(), topics)
    probe = LogOffsets(kafka.as_librdkafka())
    try:
        counts = {t.name: len(probe.partitions(t.name)) for t in topics}
    finally:
        probe.close()
    try:
        keying = plan_keying(
            spec.key,
            [(t.name, t.key_field, counts[t.name]) for t in topics],
            [(link.via, link.key) for link in spec.key_links],
            options.max_tasks or 1,
        )
    except KeyingError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    logger.info("%s: %s", spec.name, keying.reason)
    if keying.slots and not options.source_format.startswith("refold_kafka_ranges"):
        msg = (
            f"{spec.name} is re-keyed ({keying.reason}): it needs source_format "
            "refold_kafka_ranges, where each writer slot reads the batch's ranges itself"
        )
        raise ProcessorConfigError(msg)
    return keying


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


def _check_dedupe(projection: Projection, dedupe: EventId | None) -> None:
    """De-duplication by event id is a rule of entity folds: refuse it anywhere else."""
    if dedupe is None:
        return
    kind = (
        "a DataFrame processor"
        if is_dataframe_processor(projection)
        else "an archive"
        if is_archive_processor(projection)
        else "a window fold"
        if getattr(projection, "windows", None)
        else "a lookup fold"
        if getattr(projection, "lookup", None)
        else None
    )
    if kind is not None:
        msg = (
            f"{projection.name} is {kind}, but its spec declares dedupe=, which only entity "
            "folds apply. Operator action: remove dedupe from its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)


def _check_event_time(
    projection: Projection, event_time: EventTime | None, keying: Keying | None
) -> None:
    """Windows need an event time; event time needs entities owned by partitions (for now).

    A DataFrame processor has none: its watermark is Spark's, in its transform.
    """
    name = projection.name
    if event_time is not None and is_dataframe_processor(projection):
        msg = (
            f"{name} is a DataFrame processor, whose lateness is Spark's (withWatermark in its "
            "transform), but its spec declares an event_time that nothing would apply. "
            "Operator action: remove event_time from its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)
    if getattr(projection, "windows", None) and event_time is None:
        msg = (
            f"{name} declares windows but its spec has no event_time. Operator action: add "
            "event_time=EventTime(field=...) to its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)
    if event_time is not None and keying is not None and keying.slots:
        msg = (
            f"{name} has an event time but is re-keyed ({keying.reason}). Lateness is judged "
            "per source partition, which needs the partition key as the processor's key: "
            "declare the topics' partition key as its key (window buckets are additive, any "
            "group works)."
        )
        raise ProcessorConfigError(msg)


def _top_packages(*references: str) -> list[str]:
    return sorted({ref.partition(":")[0].split(".")[0] for ref in references if ref})


def run_processors(
    jobs: list[ProcessorJob],
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    spark_settings: SparkSettings,
) -> list[str]:
    """Run processors as queries of ONE Spark application, until stopped or caught up.

    Each query keeps its own generation, checkpoint, lease and restarts (it runs
    :func:`run_processor` in a thread of its own, in a FAIR scheduler pool named after it); a
    query that fails stops alone and the others go on. SIGTERM/SIGINT stop them all after their
    current micro-batch.

    Returns:
        The names of the processors that failed (each failure is logged).
    """
    from refold.processors.runtime.spark import build_spark_session, check_kafka_connector

    if any(job.options.source_format == "kafka" for job in jobs):
        check_kafka_connector(spark_settings)  # before a JVM starts: one line, what to do
    names = [job.spec.name for job in jobs]
    ship = _top_packages(
        "refold",
        *(j.spec.projection for j in jobs),
        *(j.spec.options for j in jobs),
    )
    spark = build_spark_session(f"refold-{'+'.join(names)}", spark_settings, ship=ship)
    stop = threading.Event()
    failed: list[str] = []

    started = {job.spec.name: threading.Event() for job in jobs}

    def _run(job: ProcessorJob) -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", job.spec.name)
        try:
            run_processor(
                job.projection,
                job.topics,
                kafka,
                redis_settings,
                job.options,
                spark,
                stop,
                job.spec,
                started[job.spec.name],
            )
        except RefoldError as exc:  # refold's own refusals say what to do: one line each
            logger.error("%s failed; the other processors go on: %s", job.spec.name, exc)
            failed.append(job.spec.name)
        except Exception:  # one processor's failure must not stop the others
            logger.exception("%s failed; the other processors go on", job.spec.name)
            failed.append(job.spec.name)
        finally:
            started[job.spec.name].set()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping %s after their current batch", signum, ", ".join(names))
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, _on_signal)
    threads = [threading.Thread(target=_run, args=(job,), name=job.spec.name) for job in jobs]
    try:
        for thread, job in zip(threads, jobs, strict=True):
            thread.start()
            # One query's first micro-batch at a time: several queries submitting their first
            # jobs at the same instant failed now and then in Spark's task deserialization
            # (java.io.OptionalDataException, seen with five queries on local[2]).
            started[job.spec.name].wait(_FIRST_BATCH_WAIT_S)
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return failed
