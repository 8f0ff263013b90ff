"""Spark's Python worker daemon, minus Spark's archives (``spark.python.daemon.module``).

It takes ``pyspark.zip`` and the other archives Spark puts on a worker's path off it
(:mod:`refold.processors.runtime.spark_archives`: a task re-read their directories, 50-200 ms a
task) where a worker did not start without them already (a cluster's executors), imports the
modules every task needs once, then runs the real daemon (``pyspark.daemon``), which forks the
workers. A worker whose socket Spark has closed exits quietly (:func:`quiet_when_spark_closed`).
"""

from __future__ import annotations

import gc
import importlib
import socket
from collections.abc import Callable

from refold.processors.runtime.spark_archives import strip_spark_zips

__all__ = ["preload_worker_modules", "quiet_when_spark_closed"]

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


if __name__ == "__main__":
    strip_spark_zips()
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
