"""Spark's Python worker daemon, minus Spark's archives (``spark.python.daemon.module``).

It takes ``pyspark.zip`` and the other archives Spark puts on a worker's path off it
(:mod:`refold.processors.runtime.spark_archives`: a task re-read their directories, 50-200 ms a
task) where a worker did not start without them already (a cluster's executors), imports the
modules every task needs once, then runs the real daemon (``pyspark.daemon``), which forks the
workers. A worker whose socket Spark has closed exits quietly (:func:`quiet_when_spark_closed`).

Spark starts the daemons of its driver-side planners (a Python data source's lookup, creation
and read planning) as ``python -m pyspark.daemon`` whatever the setting says. In the Python
processes of a refold driver's JVM, ``worker_startup/sitecustomize.py`` sends those to
:func:`run_daemon` too (:class:`PlannerDaemonRedirect`), without the task modules.
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import importlib.machinery
import os
import socket
import sys
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType

from refold.contracts.logconfig import LOG_FORMAT_ENV, LOG_LEVEL_ENV, configure_logging
from refold.processors.runtime.spark_archives import strip_spark_zips

__all__ = [
    "PlannerDaemonRedirect",
    "log_like_the_driver",
    "preload_worker_modules",
    "quiet_when_spark_closed",
    "run_daemon",
]

Worker = Callable[[socket.socket, bool], int | None]


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


def quiet_when_spark_closed(worker: Worker) -> Worker:
    """``pyspark.daemon.worker``, exiting without a traceback when Spark closed its socket.

    Spark closes an idle worker's socket to end it: after a minute without tasks, and when the
    application stops. The worker then fails to send its last bytes. Over TCP that write goes
    into the socket's buffer and the worker ends silently. Over a Unix socket (refold's
    ``spark.python.unix.domain.socket.enabled``) it fails at once, and PySpark 4.1's daemon
    (``killWorkerOnFlushFailure``) raises and prints a ``BrokenPipeError`` traceback into the
    processor's log: one per worker each time the processor has been quiet for a minute, and
    now and then one as it stops. Nothing is lost: Spark has stopped listening to that worker.
    A non-zero code makes the daemon end the worker instead of reusing it, which is what
    PySpark's raise does. Wrapping the daemon's function is the only hook PySpark gives (a
    worker module must be named ``pyspark*``).
    """

    def run(sock: socket.socket, authenticated: bool) -> int | None:
        try:
            return worker(sock, authenticated)
        except (BrokenPipeError, ConnectionResetError):
            return 1

    return run


def log_like_the_driver() -> None:
    """Log in the driver's format (``REFOLD_LOG_FORMAT``), in the daemon and the workers it forks.

    What a task logs (a batch's dead-letter summary, an outage) otherwise went through Python's
    last-resort handler: a bare message in the middle of the processor's log. The driver's
    :func:`~refold.contracts.logconfig.configure_logging` records its format and level in the
    environment the JVM and these daemons inherit (on a cluster: ``spark.executorEnv.*``).
    """
    log_format = os.environ.get(LOG_FORMAT_ENV)
    if log_format is None:
        return  # not started by a refold driver: leave logging as it is
    try:
        configure_logging(os.environ.get(LOG_LEVEL_ENV, "INFO"), log_format=log_format)
    except ValueError:  # a misspelt format: the driver said so already
        return


def run_daemon(*, preload: bool) -> None:
    """Run PySpark's daemon in this process, its workers ending quietly; returns when it ends.

    Args:
        preload: Import the modules every refold task needs first (the task daemon), not for
            a planner's daemon.
    """
    strip_spark_zips()
    log_like_the_driver()
    if preload:
        preload_worker_modules()
    # PySpark's daemon runs a full gc.collect() in each worker after every task, which walks
    # every object the imports made (~80k here, ~20 ms a task). Frozen before the workers are
    # forked, they are left out of every collection (and their pages stay shared). Import-time
    # objects live as long as the process anyway.
    gc.freeze()
    # Imported rather than run as __main__, so that its manager calls the wrapped worker.
    import pyspark.daemon

    pyspark.daemon.worker = quiet_when_spark_closed(pyspark.daemon.worker)
    pyspark.daemon.manager()  # type: ignore[no-untyped-call]


_PLANNER_DAEMON_MAIN = (
    "from refold.processors.runtime.spark_daemon import run_daemon\nrun_daemon(preload=False)\n"
)


class PlannerDaemonRedirect(importlib.abc.Loader):
    """Runs :func:`run_daemon` where ``python -m pyspark.daemon`` was asked for.

    Installed first on ``sys.meta_path`` by the ``sitecustomize`` of a refold driver's Python
    processes, in a process started as ``-m pyspark.daemon`` only. ``runpy`` looks the module
    up once, and asks its loader for the code it runs as ``__main__``: here, a call of
    :func:`run_daemon`. The finder leaves ``sys.meta_path`` at that lookup, so that
    :func:`run_daemon` imports the real ``pyspark.daemon``.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """``runpy``'s lookup of ``pyspark.daemon``: this loader; any other module: None."""
        if fullname != "pyspark.daemon":
            return None
        sys.meta_path.remove(self)
        return importlib.machinery.ModuleSpec(fullname, self, origin=__file__)

    def get_code(self, fullname: str) -> CodeType:
        """What ``runpy`` runs as ``__main__``."""
        return compile(_PLANNER_DAEMON_MAIN, __file__, "exec")


if __name__ == "__main__":
    run_daemon(preload=True)
