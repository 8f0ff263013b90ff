"""Run processors as Spark Structured Streaming queries (driver side): the entry point.

Shared by every processor's ``__main__``: checks the spec against the fold
(:mod:`.run_checks`), resolves the generation, its checkpoint and starting offsets
(:mod:`.run_plan`), creates the topics, then runs the generation's query
(:mod:`.query_loop`) and follows the live alias to the next generation after a cutover.
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
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

import redis

from refold.contracts.errors import RefoldError
from refold.contracts.fingerprints import NOTHING_DECLARED, DeclaredCode
from refold.contracts.processors import (
    EventId,
    EventTime,
    ProcessorSpec,
    StateTtl,
    consumer_group,
)
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.lease import GenerationLease
from refold.contracts.topics import TopicSpec
from refold.processors.errors import REDIS_UNAVAILABLE, ProcessorConfigError, ProcessorError
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying
from refold.processors.runtime.checkpoints import (
    has_batches,
    remove_stale_checkpoint,
)
from refold.processors.runtime.code_identity import check_follow
from refold.processors.runtime.dataframe import (
    redis_behind_message,
    refuse_lost_checkpoint,
)
from refold.processors.runtime.engines import Engine, engine_of
from refold.processors.runtime.output_transactions import fence_writers
from refold.processors.runtime.query_loop import (
    RestartBudget,
    run_generation,
)
from refold.processors.runtime.run_checks import (
    check_dedupe,
    check_event_time,
    check_marker_source,
    check_state_ttl,
    plan_keying_of,
)
from refold.processors.runtime.run_plan import (
    GenerationChoice,
    ProcessorJob,
    ProcessorRun,
    RunOptions,
    record_starting_positions,
    resolve_run,
    until_redis_answers,
)
from refold.processors.runtime.sent_outputs import with_sent_outputs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "GenerationChoice",
    "ProcessorJob",
    "ProcessorRun",
    "RunOptions",
    "consumer_group",
    "run_processor",
    "run_processors",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Processor:
    """What every start of one processor uses: checked once, before the first generation."""

    projection: Projection
    engine: Engine
    topics: list[TopicSpec]
    kafka: KafkaSettings
    redis_settings: RedisSettings
    client: redis.Redis
    registry: GenerationRegistry
    keying: Keying | None
    event_time: EventTime | None
    dedupe: EventId | None
    declared: DeclaredCode
    state_ttl: StateTtl | None = None

    @property
    def who(self) -> str:
        return f"the processor {self.projection.name}"

    def resolve(self, options: RunOptions) -> ProcessorRun:
        """The generation, checkpoint and starting offsets ``options`` call for."""
        return resolve_run(
            self.projection,
            self.topics,
            self.kafka,
            self.redis_settings,
            options,
            self.client,
            self.keying,
            self.event_time,
            dedupe=self.dedupe,
            declared=self.declared,
            state_ttl=self.state_ttl,
        )

    def until_redis_answers(self, call: Callable[[], _T]) -> _T:
        return until_redis_answers(call, self.redis_settings, self.client, self.who)


def _checked(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    options: RunOptions,
    spec: ProcessorSpec | None,
) -> _Processor:
    """The spec checked against the fold and the broker (keying, event time, dedupe, markers)."""
    engine = engine_of(projection)
    # Only an engine whose entities are owned by tasks is re-keyed (not a DataFrame processor,
    # whose rows the driver writes, nor an archive, which has no entities).
    keyed = spec is not None and engine.keyed
    keying = plan_keying_of(spec, topics, kafka, options) if spec and keyed else None
    event_time = None if spec is None else spec.event_time
    check_event_time(projection, event_time, keying)
    dedupe = None if spec is None else spec.dedupe
    check_dedupe(projection, dedupe)
    state_ttl = None if spec is None else spec.state_ttl
    check_state_ttl(projection, state_ttl, event_time)
    check_marker_source(projection, topics, options)
    client = redis_client(redis_settings.client_url())
    registry = GenerationRegistry.of(client, projection.name, redis_settings.key_prefix)
    declared = NOTHING_DECLARED if spec is None else spec.declared_code
    return _Processor(
        projection,
        engine,
        topics,
        kafka,
        redis_settings,
        client,
        registry,
        keying,
        event_time,
        dedupe,
        declared,
        state_ttl,
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
    if not engine_of(projection).rebuilds_on_code_change:
        # One lineage whatever the code (an archive's files: new files get the new columns).
        options = dataclasses.replace(options, accept_code_change=True)
    processor = _checked(projection, topics, kafka, redis_settings, options, spec)
    bounded = options.available_now or bool(options.ending_offsets)
    following = options.generation == "live" and not bounded
    loop = _Loop(options, options.lease_wait_s)
    while True:
        picked = processor.until_redis_answers(functools.partial(processor.resolve, loop.options))
        lease = GenerationLease(processor.registry, picked.generation)
        lease.acquire(loop.wait_s)
        try:
            # Resolved again under the lease: while it waited, the previous holder went on
            # committing, and an in-place reset may have moved the checkpoint epoch.
            run = processor.resolve(dataclasses.replace(loop.options, generation=picked.generation))
            if loop.options.generation == "live" and processor.registry.live() != run.generation:
                logger.info("g%d is no longer live; picking again", run.generation)
                continue
            _fence_writers(processor, run.generation)
            # What earlier runs sent, from Kafka: a Redis that came back empty forgot it.
            target = processor.until_redis_answers(
                functools.partial(with_sent_outputs, processor.client, run.target)
            )
            run = dataclasses.replace(run, target=target)
            run, spark = _prepared(processor, run, loop.options, spark)
            outcome = run_generation(
                projection,
                topics,
                kafka,
                loop.options,
                spark,
                run,
                processor.registry,
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
        loop.after(processor, run, outcome, following, stop)


def _fence_writers(processor: _Processor, generation: int) -> None:
    """Abort at once what the generation's earlier writers left open (output_transactions)."""
    key = processor.registry.keys(generation).writers
    kafka = processor.kafka.as_librdkafka()
    fenced = processor.until_redis_answers(lambda: fence_writers(kafka, processor.client, key))
    if fenced:
        logger.info("g%d: fenced %d output writer(s) of its earlier holders", generation, fenced)


def _prepared(
    processor: _Processor, run: ProcessorRun, options: RunOptions, spark: SparkSession | None
) -> tuple[ProcessorRun, SparkSession]:
    """The run with its starting positions recorded, and the session (built on first use)."""
    projection, registry = processor.projection, processor.registry
    if processor.engine.state_in_checkpoint:
        refuse_lost_checkpoint(
            projection.name,
            run.generation,
            has_batches(run.checkpoint),
            registry.positions(run.generation)[1],
        )
    run = record_starting_positions(run, registry, processor.kafka, processor.topics)
    if spark is None:
        from refold.processors.runtime.spark import build_spark_session, check_kafka_connector

        if options.source_format == "kafka":
            check_kafka_connector(SparkSettings())
        spark = build_spark_session(f"refold-{projection.name}-g{run.generation}", SparkSettings())
    return run, spark


@dataclasses.dataclass(slots=True)
class _Loop:
    """What the processor's restart loop carries from one generation's run to the next."""

    options: RunOptions
    wait_s: float  # how long the next start waits for the generation's lease
    # Restarts after a transient failure (query_loop.transient_failure), counted in a row.
    restarts: RestartBudget = dataclasses.field(default_factory=RestartBudget)

    def after(
        self,
        processor: _Processor,
        run: ProcessorRun,
        outcome: str,
        following: bool,
        stop: threading.Event | None = None,
    ) -> None:
        """Prepare the next start after a run that ended with ``outcome`` (or raise)."""
        name = processor.projection.name
        self.wait_s = self.options.lease_wait_s
        if outcome == "retired":
            self._follow(processor, run)
        elif outcome == "behind":
            if processor.engine.state_in_checkpoint:
                # Its state is in Spark's checkpoint, past what Redis lost.
                raise ProcessorConfigError(redis_behind_message(name, run.generation))
            # Redis lost writes Spark's checkpoint has passed: plan from Redis' positions.
            remove_stale_checkpoint(run.checkpoint)
        elif outcome == "restart":
            registry = processor.registry
            applied = processor.until_redis_answers(
                functools.partial(registry.positions, run.generation)
            )
            if not self.restarts.spend(applied):
                msg = (
                    f"{name}: its query failed {self.restarts.in_a_row} times in a row, with "
                    "no batch committed in between, for reasons that usually pass (logged "
                    "above); giving up"
                )
                raise ProcessorError(msg)
            # Such failures come from a loaded machine (a worker missing Spark's 10 s): pause.
            pause = self.restarts.pause_s()
            logger.warning(
                "%s g%d: restart %d in a row (at most %d) in %.0f s",
                name,
                run.generation,
                self.restarts.in_a_row,
                self.restarts.limit,
                pause,
            )
            if stop is None:
                time.sleep(pause)
            else:
                stop.wait(pause)  # a stop during the pause is honoured at once
        elif outcome == "vanished":
            if not following:
                msg = (
                    f"{name} g{run.generation} vanished from Redis (restarted empty?). Operator "
                    f"action: rebuild it with `replay --processor {name} --to-earliest "
                    "--execute`, or run the processor with --generation live to start over "
                    "from the log."
                )
                raise ProcessorConfigError(msg)
            remove_stale_checkpoint(run.checkpoint)

    def _follow(self, processor: _Processor, run: ProcessorRun) -> None:
        """After a cutover: check the new live generation's code, then wait for its lease."""
        registry = processor.registry
        live = processor.until_redis_answers(registry.live)
        if live is not None and processor.engine.rebuilds_on_code_change:
            # Raises when the new live generation was built by other code: this process
            # stops rather than fold it with its old code (an accepted change at start
            # was for the generation it started on, not for a later rebuild's).
            processor.until_redis_answers(
                functools.partial(
                    check_follow,
                    registry,
                    processor.projection,
                    run.generation,
                    live,
                    processor.declared,
                )
            )
            self.options = dataclasses.replace(self.options, accept_code_change=False)
        # The rebuild's processor still holds the new generation until it has stopped.
        self.wait_s = 300.0


# How long an application waits for one query's first micro-batch before starting the next.
_FIRST_BATCH_WAIT_S = 120.0


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
