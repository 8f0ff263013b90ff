"""Spark's bundled archives on its Python processes' path, and how refold takes them off.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, the py4j zip and the ``spark-core`` jar first
on the ``sys.path`` of every Python process it starts: the task workers, and on the driver the
planners of a Python data source (its lookup, its schema, the planning of its reads) and the
streaming source's runner. The zip holds sources only, no bytecode, so every such process
compiled PySpark's modules again: ~0.3 CPU-s more a process here, beside the JVM (``import
pyspark.sql.worker.create_data_source`` took 0.7 s from the zip against 0.2 s from the installed
package on an idle core), four of them one after the other before a processor's first task.
And PySpark 4.1 calls ``importlib.invalidate_caches()`` at the start of every task, which makes
each ``zipimport`` re-read its archive's directory (50-200 ms a task). With PySpark installed as
a package (the pip wheel) these archives hold nothing a process needs, so refold takes them off
the path:

* :func:`strip_spark_zips`, at the start of every process: the ``sitecustomize`` of
  :data:`WORKER_STARTUP` runs it, a directory :func:`~refold.processors.runtime.spark.
  build_spark_session` puts on the ``PYTHONPATH`` of the driver JVM it starts (whose Python
  processes inherit it);
* and in refold's worker daemon (``spark_daemon``), for executors that do not inherit it (a
  cluster's).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["WORKER_STARTUP", "strip_spark_zips", "with_worker_startup"]

_ARCHIVE_DIRS = (os.path.join("pyspark", "python", "lib"), os.path.join("pyspark", "jars"))
# Holds only ``sitecustomize.py``: every module of a directory on PYTHONPATH could shadow one.
WORKER_STARTUP = Path(__file__).resolve().parent / "worker_startup"


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


def with_worker_startup(python_path: str) -> str:
    """``python_path`` (a ``PYTHONPATH``) with :data:`WORKER_STARTUP` first, once."""
    entries = [p for p in python_path.split(os.pathsep) if p and p != str(WORKER_STARTUP)]
    return os.pathsep.join([str(WORKER_STARTUP), *entries])
