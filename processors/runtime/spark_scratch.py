"""A driver's scratch space, which a killed processor does not leave.

Spark's driver keeps its temporary files in ``spark.local.dir`` (``/tmp`` by default), among
them copies of the application's jars (``spark-<uuid>/userFiles-<uuid>``: ~10 MB with the
Kafka connector's), and removes them in a JVM shutdown hook, which a kill -9 never runs: each
crash left them in ``/tmp`` for good. So each driver process gets a directory of its own under
one root, named by its pid, and every driver that starts first removes the directories of
processes that have ended. It is the JVM's own temporary directory too (``java.io.tmpdir``,
where Spark makes ``artifacts-<uuid>``, ``spark-<uuid>`` and its Python workers' Unix sockets,
``.<uuid>.sock``, ~70 of which a ``make test`` run used to leave in ``/tmp``), while a socket's
path fits in it (:func:`java_temp_dir_option`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from refold.contracts.process_group import alive
from refold.processors.runtime.jvm_options import path_option

__all__ = ["driver_scratch", "java_temp_dir_option", "scratch_root", "sweep_ended"]

# A Unix socket's path holds 107 bytes (sun_path); Spark names a Python worker's socket
# "<dir>/.<uuid>.sock": 43 bytes after the directory.
_SOCKET_PATH_MAX = 107
_SOCKET_NAME = len("/.00000000-0000-0000-0000-000000000000.sock")


def scratch_root() -> Path:
    """The root of the drivers' directories: ``<temp dir>/refold-spark-<uid>``."""
    return Path(tempfile.gettempdir()) / f"refold-spark-{os.getuid()}"


def driver_scratch(root: Path | None = None) -> Path:
    """This process's directory under ``root`` (made), once those of ended processes are gone."""
    root = root or scratch_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_ended(root)
    mine = root / str(os.getpid())
    mine.mkdir(exist_ok=True)
    return mine


def sweep_ended(root: Path) -> list[Path]:
    """Remove the directories under ``root`` of processes that have ended; returns them."""
    removed = []
    for entry in root.iterdir():
        if entry.name.isdigit() and not alive(int(entry.name)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def java_temp_dir_option(scratch: Path) -> str:
    """The driver JVM's option that makes ``scratch`` its ``java.io.tmpdir``, or ``""``.

    Spark makes its Python workers' Unix sockets there too (in local mode every one; on a
    cluster, the driver's own), and a socket's path may hold 107 bytes: under a long temporary
    directory (``TMPDIR``) the JVM keeps its default, ``/tmp``.
    """
    fits = len(os.fsencode(scratch)) + _SOCKET_NAME <= _SOCKET_PATH_MAX
    return path_option("-Djava.io.tmpdir=", scratch) if fits else ""
