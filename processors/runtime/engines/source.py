"""The processor's source stream, as every engine reads it (driver side)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from refold.contracts.kafka.java_client import JavaClientConfigError
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.processors.errors import ProcessorConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from refold.processors.runtime.run_plan import ProcessorRun, RunOptions

__all__ = ["source_stream"]


def source_stream(
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
