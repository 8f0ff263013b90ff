"""SparkSession construction for processors and tests (driver side only)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["build_spark_session"]


def build_spark_session(app_name: str, master: str | None = None) -> SparkSession:
    """Build (or get) a SparkSession tuned for small local streaming jobs.

    Args:
        app_name: Shown in Spark's logs.
        master: Spark master URL; default ``REFOLD_SPARK_MASTER`` or ``local[2]``.

    Returns:
        The session, with the refold Kafka source registered.
    """
    from pyspark.sql import SparkSession

    # Executors must run the same interpreter (and virtualenv) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("REFOLD_SPARK_MASTER", "local[2]"))
        # No UI: nothing to look at in tests and demos, and it saves a port and memory.
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Tiny batches: the default 200 shuffle partitions would be 200 empty tasks.
        .config("spark.sql.shuffle.partitions", "2")
        # Python workers are reused, so per-process Kafka/Redis clients survive across tasks.
        .config("spark.python.worker.reuse", "true")
        # Drops pyspark.zip from the workers' path: saves ~55 ms per task (spark_daemon.py).
        .config("spark.python.daemon.module", "processors.runtime.spark_daemon")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Streaming progress is reported by refold itself; keep Spark's own logs quiet.
        .config("spark.sql.streaming.metricsEnabled", "false")
        .config("spark.driver.memory", os.environ.get("REFOLD_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=warn")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    from processors.runtime.kafka_source import KafkaDataSource, KafkaRangesDataSource

    session.dataSource.register(KafkaDataSource)
    session.dataSource.register(KafkaRangesDataSource)
    return session
