"""Spark's Python worker daemon, minus ``pyspark.zip`` (``spark.python.daemon.module``).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, the py4j zip and the ``spark-core`` jar (a
zip of ~10k entries) on every Python worker's path, and PySpark 4.1 calls
``importlib.invalidate_caches()`` at the start of every task (``worker_util.setup_spark_files``).
On Python 3.11 that makes each ``zipimporter`` re-read its archive's directory: 50-200 ms per
task, measured here, paid by every source read and every ``mapInArrow`` task of every
micro-batch. With pyspark installed as a package (the pip wheel) these archives hold nothing a
worker imports, so they are dropped before the real daemon (``pyspark.daemon``) starts. Where
pyspark exists only in the zip (a plain Spark distribution), nothing is changed.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import runpy
import sys

__all__ = ["preload_worker_modules", "strip_spark_zips"]

_ARCHIVE_DIRS = (os.path.join("pyspark", "python", "lib"), os.path.join("pyspark", "jars"))


def _is_spark_archive(path: str) -> bool:
    return path.endswith((".zip", ".jar")) and any(d in path for d in _ARCHIVE_DIRS)


def strip_spark_zips() -> list[str]:
    """Remove Spark's bundled archives from ``sys.path`` if pyspark is importable without them.

    Returns:
        The entries removed.
    """
    zips = [p for p in sys.path if _is_spark_archive(p)]
    if not zips:
        return []
    kept = [p for p in sys.path if p not in zips]
    saved = sys.path[:]
    sys.path[:] = kept
    if importlib.util.find_spec("pyspark") is None:  # only the zip has it: keep everything
        sys.path[:] = saved
        return []
    for key in list(sys.path_importer_cache):
        if any(key == z or key.startswith(z + os.sep) for z in zips):
            del sys.path_importer_cache[key]
    return zips


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
