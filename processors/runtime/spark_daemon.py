"""Spark's Python worker daemon, minus Spark's archives (``spark.python.daemon.module``).

It takes ``pyspark.zip`` and the other archives Spark puts on a worker's path off it
(:mod:`refold.processors.runtime.spark_archives`: a task re-read their directories, 50-200 ms a
task) where a worker did not start without them already (a cluster's executors), imports the
modules every task needs once, then runs the real daemon (``pyspark.daemon``), which forks the
workers.
"""

from __future__ import annotations

import gc
import importlib
import runpy

from refold.processors.runtime.spark_archives import strip_spark_zips

__all__ = ["preload_worker_modules"]


# Imported once in the daemon, so that every worker it forks starts with them (~0.4 s a cold
# worker otherwise; a micro-batch meeting a fresh worker waits for it). Imports only: clients
# (Kafka, Redis) must not cross a fork, and are created per worker on first use.
_PRELOAD = ("refold.processors.runtime.sink", "refold.processors.runtime.kafka_source")


def preload_worker_modules() -> list[str]:
    """Import the modules every refold task needs; returns those that failed to import.

    A failure is not fatal here: the task imports the module itself and reports the error.
    """
    failed = []
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a worker then imports it itself and reports why
            failed.append(name)
    return failed


if __name__ == "__main__":
    strip_spark_zips()
    preload_worker_modules()
    # PySpark's daemon runs a full gc.collect() in each worker after every task, which walks
    # every object the imports made (~80k here, ~20 ms a task). Frozen before the workers are
    # forked, they are left out of every collection (and their pages stay shared). Import-time
    # objects live as long as the process anyway.
    gc.freeze()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
