"""Spark's own log: the expected "Failed to cancel job group" at a query's stop is denied, the
rest of the same logger's warnings stay (asked of the session's log4j, as Spark logs them)."""

from __future__ import annotations

from typing import Any

DAG_SCHEDULER = "org.apache.spark.scheduler.DAGScheduler"


def _would_log(spark: Any, logger_name: str, message: str) -> bool:
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    logger = log4j.LogManager.getLogger(logger_name)
    return bool(logger.isEnabled(log4j.Level.WARN, None, message))


def test_a_job_group_spark_had_nothing_to_cancel_is_not_logged(spark):
    stop_noise = "Failed to cancel job group 5c1e-77. Cannot find active jobs for it."
    assert not _would_log(spark, DAG_SCHEDULER, stop_noise)


def test_the_schedulers_other_warnings_are_kept(spark):
    assert _would_log(spark, DAG_SCHEDULER, "Broadcasting large task binary with size 1.2 MiB")
    assert _would_log(spark, "org.apache.spark.executor.Executor", "Failed to cancel job group")
