"""A generation's streaming query, started: its driver task, its topics, its sink and source.

:mod:`.query_loop` watches the query this module starts (alias, Redis, lease, signals).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets_json import to_offsets_json
from refold.contracts.registry import default_registry
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.generations import Positions
from refold.contracts.topics import TopicSpec, dead_letter_spec
from refold.processors.fold.projection import Projection
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.checkpoints import has_batches
from refold.processors.runtime.engines import QueryStart, RunningSink, engine_of
from refold.processors.runtime.group_mirror import ConsumerGroupMirror
from refold.processors.runtime.output_topics import output_topic_specs, output_topics
from refold.processors.runtime.run_plan import ProcessorRun, RunOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "driver_task",
    "ensure_generation_topics",
    "log_start",
    "start_query",
]

logger = logging.getLogger(__name__)


def driver_task(
    projection: Projection, run: ProcessorRun, kafka: KafkaSettings, options: RunOptions
) -> tuple[DriverTask | None, list[str]]:
    """The engine's driver task (a window closer, a lookup joiner), and the output topics."""
    outputs = output_topics(projection, run.target.event_time, options.windows_topic)
    return engine_of(projection).driver_task(projection, run, kafka, options), outputs


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
) -> tuple[RunningSink, StreamingQuery]:
    """The sink of the processor's engine (fold, DataFrame, archive), and its started query."""
    start = QueryStart(projection, topics, kafka, options, spark, run, mirror, closer)
    return engine_of(projection).start(start)
