"""Run by every Python process a refold driver's JVM starts, before anything else is imported.

refold puts this directory on the driver JVM's ``PYTHONPATH``
(:mod:`refold.processors.runtime.spark_archives` says why): Spark's archives leave the path
here, so PySpark is imported from its installed package, with its bytecode. A process started
as ``python -m pyspark.daemon`` (Spark's planners' daemons) runs refold's daemon instead, whose
workers end quietly when Spark closes them
(:class:`refold.processors.runtime.spark_daemon.PlannerDaemonRedirect`). A process that finds
the driver stopped before it connected says so in one line rather than a traceback
(:mod:`refold.processors.runtime.spark_exits`). Then the
``sitecustomize`` this one hides, if the environment has one, runs as it would have. Nothing
here may stop a process: on any error the path stays as Spark made it, and the daemon PySpark's.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import PathFinder

_HERE = os.path.dirname(os.path.realpath(__file__))


def _run_hidden_sitecustomize() -> None:
    # Real paths: this directory spelled another way (a symlink) must not find this file again.
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    from refold.processors.runtime.spark_archives import strip_spark_zips

    strip_spark_zips()
except Exception:  # a speed-up only: never a reason for a worker not to start  # noqa: S110
    pass
try:
    # Spark starts a daemon as [python, -m, module, worker module]. Checked before importing:
    # refold's own daemon module (the tasks') must not be imported before it runs as __main__.
    if sys.orig_argv[1:3] == ["-m", "pyspark.daemon"]:
        from refold.processors.runtime.spark_daemon import PlannerDaemonRedirect

        sys.meta_path.insert(0, PlannerDaemonRedirect())
except Exception:  # quieter logs only: never a reason for a daemon not to start  # noqa: S110
    pass
try:
    from refold.processors.runtime.spark_exits import install

    install()
except Exception:  # quieter logs only  # noqa: S110
    pass
_run_hidden_sitecustomize()
