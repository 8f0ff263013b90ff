"""A generation's streaming query: built, watched (alias, Redis, lease, signals), then stopped."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Literal

from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.offsets_json import parse_offsets_json
from refold.contracts.layout import position_field
from refold.contracts.processors import (
    consumer_group,
)
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.generations import (
    GenerationRegistry,
    Positions,
)
from refold.contracts.store.lease import GenerationLease
from refold.contracts.topics import TopicSpec
from refold.processors.errors import REDIS_UNAVAILABLE, ProcessorConfigError
from refold.processors.fold.projection import Projection
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.engines import RunningSink, engine_of
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.query_start import (
    driver_task,
    ensure_generation_topics,
    log_start,
    start_query,
)
from refold.processors.runtime.run_plan import (
    ProcessorRun,
    RunOptions,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

logger = logging.getLogger(__name__)


Outcome = Literal["stopped", "caught_up", "retired", "behind", "vanished", "restart"]


# Spark 4.1.1's Kafka source (SPARK-55271, fixed in 4.1.3, whose connector jars Maven does not
# serve here yet) fails a query after the first batch it runs again from the checkpoint's
# offsets log (a crash mid-batch): reporting that batch's progress throws this NPE. The batch
# was applied and is in Spark's commit log by then, so the runner starts the query again.
_SPARK_55271 = 'the return value of "scala.Option.get()" is null'
# Spark waits a fixed 10 s for a new Python process (a data source's runner, a simple worker)
# to connect back (PythonWorkerFactory.createSimpleWorker; no setting in Spark 4.1). On a loaded
# machine one missed it, which failed the query before its first batch (CI and `make test`).
_WORKER_NOT_CONNECTED = "Python worker failed to connect back"

# Restarts after such failures in a row (no batch committed in between) before it gives up,
# each after a pause that doubles: a loaded machine gets ~2 minutes to calm down.
QUERY_RESTARTS = 5
_FIRST_PAUSE_S = 5.0
_LONGEST_PAUSE_S = 40.0


@dataclasses.dataclass(slots=True)
class RestartBudget:
    """Counts a processor's query restarts in a row, so a long run never uses them up.

    A restart is told where the generation's applied positions stood (Redis' positions and
    batch id); when they moved since the previous restart, a batch was committed in between
    and the count starts again.
    """

    limit: int = QUERY_RESTARTS
    in_a_row: int = 0
    _mark: object = None

    def spend(self, applied: object) -> bool:
        """Count a restart at ``applied``; False once more than ``limit`` came in a row."""
        self.in_a_row = self.in_a_row + 1 if applied == self._mark else 1
        self._mark = applied
        return self.in_a_row <= self.limit

    def pause_s(self) -> float:
        """How long to wait before this restart: 5 s, doubling in a row, at most 40 s."""
        return min(_LONGEST_PAUSE_S, _FIRST_PAUSE_S * 2.0 ** max(0, self.in_a_row - 1))


def transient_failure(failure: BaseException, source_format: str) -> str | None:
    """Why a failed query may simply be started again (from its checkpoint), or None.

    Starting again is what a processor does after a kill -9: every batch is applied once.
    """
    text = str(failure)
    if source_format == "kafka" and _SPARK_55271 in text:
        return (
            "Spark's Kafka source failed to report the progress of a batch it ran again from "
            "its checkpoint (SPARK-55271 of Spark 4.1.1); the batch is applied"
        )
    if _WORKER_NOT_CONNECTED in text:
        return "a new Python worker did not connect back to Spark within Spark's fixed 10 s"
    return None


# How long a caught-up run waits for its last micro-batch to end before stopping the query.
# The tasks commit to Redis (what the catch-up check sees) before the driver has collected
# their outcomes; a batch's tail after that is short (collect, group commit, Spark's commit log).
_FINISH_BATCH_S = 30.0


def _planned_ends(query: StreamingQuery) -> Positions | None:
    """End offsets of the last completed micro-batch (Spark's progress), if there was one."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    reported = progress["sources"][0]["endOffset"]
    return None if reported is None else parse_offsets_json(reported, lenient=True)


class _CatchUp:
    """Decides when an ``available_now`` run has applied everything that was in the log at start.

    A run with ending offsets (``replay --until``) is done at those instead, on the partitions
    they name.

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
        ending_offsets: str = "",
    ) -> None:
        probe = LogOffsets(kafka.as_librdkafka())
        try:
            tps = [(t.name, p) for t in topics for p in probe.partitions(t.name)]
            self.target = probe.end_offsets(tps)
            log_start = probe.start_offsets(tps)
        finally:
            probe.close()
        # A run bounded by ending offsets (a state as of a moment) is done there instead.
        self.target.update(parse_offsets_json(ending_offsets) if ending_offsets else {})
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
        # A batch that ran (its sink was called), whether or not Spark counted its rows: the
        # fold sink's planned tasks do not read the source's rows.
        if progress["batchId"] > after and "addBatch" in progress["durationMs"]:
            after = progress["batchId"]
            durations = ", ".join(f"{k} {v}" for k, v in sorted(progress["durationMs"].items()))
            logger.debug(
                "batch %d: Spark phases (ms): %s", after, durations, extra={"batch_id": after}
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
    closer, outputs = driver_task(projection, run, kafka, options)
    ensure_generation_topics(kafka, projection, topics, run, outputs)
    applied, _batch = registry.positions(run.generation)
    log_start(projection, run, applied)
    mirror = ConsumerGroupMirror(
        kafka.as_librdkafka(),
        consumer_group(projection.name, run.generation, run.target.layout.prefix),
    )
    # After a crash between the Redis commit and the group commit, the re-run batch skips
    # every record and commits nothing: mirror what Redis holds now, so lag tools agree.
    mirror.commit({position_field(t, p): o for (t, p), o in applied.items()})
    catch_up = (
        _CatchUp(kafka, topics, run, registry, options.ending_offsets)
        if options.available_now or options.ending_offsets
        else None
    )
    sink, query = start_query(projection, topics, kafka, options, spark, run, mirror, closer)
    # Whether the applied positions reach each planned batch's end (else: no behind check).
    exact_ends = engine_of(projection).exact_ends(options.source_format)
    watch = _RedisWatch(registry, run.generation, exact_ends)
    stop = external_stop or threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping the query after the current batch", signum)
        stop.set()

    previous_handlers = {}
    if external_stop is None and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, _on_signal)
    try:
        outcome = _watch_query(
            query,
            stop,
            closer=closer,
            started=started,
            lease=lease,
            catch_up=catch_up,
            watch=watch,
            following=following,
        )
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
        reason = transient_failure(failure, options.source_format)
        if reason is not None:
            logger.warning("g%d: %s. Starting the query again", run.generation, reason)
            return "restart"
        raise failure
    _log_stopped(projection, run, sink)
    return outcome


def _watch_query(
    query: StreamingQuery,
    stop: threading.Event,
    *,
    closer: DriverTask | None,
    started: threading.Event | None,
    lease: GenerationLease,
    catch_up: _CatchUp | None,
    watch: _RedisWatch,
    following: bool,
) -> Outcome:
    """Watch the running query once a second until it ends, is stopped, or Redis says why to.

    Raises:
        ProcessorConfigError: The generation's lease was lost (another processor took over).
    """
    from pyspark.errors import StreamingQueryException

    logged_batch = -1
    while query.isActive and not stop.is_set():
        try:
            query.awaitTermination(1)
        except StreamingQueryException:
            break  # query.exception(), after: raised, or a known Spark failure
        logged_batch = _log_progress(query, logged_batch)
        if closer is not None and closer.idle_rounds:
            closer.nudge()  # a lookup's table moves on its own; rounds coalesce
        if started is not None and query.lastProgress is not None:
            started.set()
        if lease.lost.is_set():
            msg = (
                f"lost the lease of g{watch.generation} (another processor took it over "
                "after this one stalled); stopping"
            )
            raise ProcessorConfigError(msg)
        try:
            if catch_up is not None and catch_up.done(query):
                logger.info("caught up with the log end taken at start; stopping")
                _finish_batch_in_flight(query)
                return "caught_up"
            changed = watch.check(query, following)
        except REDIS_UNAVAILABLE as exc:
            watch.unreachable(exc)
            continue
        if changed is not None:
            return changed
    if stop.is_set():
        # A signal stops the query "after the current batch", as its log line says: stopped
        # mid-batch, the batch would lose its consumer group commit (the kill -9 soak's
        # group != positions, once in a full run) and its totals.
        _finish_batch_in_flight(query)
    return "stopped"


def _log_stopped(projection: Projection, run: ProcessorRun, sink: RunningSink) -> None:
    """What the generation's run folded, once its query has stopped."""
    what = sink.total.describe()
    logger.info("%s generation %d stopped: %s", projection.name, run.generation, what)


def _finish_batch_in_flight(query: StreamingQuery) -> None:
    """Wait (bounded) until no trigger is running, so that stopping interrupts no batch.

    Driver side, after a stop signal or at the end of a catch-up. Stopping a query mid-batch
    interrupts its ``foreachBatch`` (a py4j InterruptedException trace in the log) and loses
    the batch's totals, its consumer group commit and its entry in Spark's commit log (the
    next run re-plans it; applied records are skipped, so the state is right either way).
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
    # A check that answers only after this long was a stall (a failover, a hung socket): said
    # in one line, though no call failed. Redis answers a status in milliseconds.
    _STALL_S = 2.0

    def __init__(self, registry: GenerationRegistry, generation: int, exact_ends: bool):
        self.registry = registry
        self.generation = generation
        # Whether the applied positions reach each batch's planned end (else: no behind check).
        self.exact_ends = exact_ends
        self._next = time.monotonic() + self._EVERY_S
        self._down_since: float | None = None
        self._called_at = time.monotonic()
        self._failed_calls = 0

    def unreachable(self, exc: Exception) -> None:
        """Note a failed check; the outage began when that call was made.

        Not when it failed: a call waits out its socket timeout first.
        """
        self._failed_calls += 1
        if self._down_since is None:
            self._down_since = self._called_at
            logger.warning("Redis unreachable (%s); the query waits for it", exc)

    def check(self, query: StreamingQuery, following: bool) -> Outcome | None:
        self._called_at = time.monotonic()
        status = self.registry.status(self.generation)
        answered = time.monotonic()
        if self._down_since is not None:
            logger.warning(
                "Redis reachable again after %.1fs (%d failed check%s); the query carries on",
                answered - self._down_since,
                self._failed_calls,
                "" if self._failed_calls == 1 else "s",
            )
            self._down_since, self._failed_calls = None, 0
        elif answered - self._called_at > self._STALL_S:
            logger.warning(
                "Redis answered after %.1fs (stalled, no call failed); the query carries on",
                answered - self._called_at,
            )
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
