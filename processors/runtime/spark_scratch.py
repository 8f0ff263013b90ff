"""A driver's scratch space (``spark.local.dir``), which a killed processor does not leave.

Spark's driver keeps its temporary files in ``spark.local.dir`` (``/tmp`` by default), among
them copies of the application's jars (``spark-<uuid>/userFiles-<uuid>``: ~10 MB with the
Kafka connector's), and removes them in a JVM shutdown hook, which a kill -9 never runs: each
crash left them in ``/tmp`` for good. So each driver process gets a directory of its own under
one root, named by its pid, and every driver that starts first removes the directories of
processes that have ended. (The JVM's ``java.io.tmpdir`` stays ``/tmp``: Spark's Python
workers' Unix sockets are made there, and a socket's path may hold 107 bytes; a crash leaves
two empty directories in it, ``spark-<uuid>`` and ``artifacts-<uuid>``.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from refold.contracts.process_group import alive

__all__ = ["driver_scratch", "scratch_root", "sweep_ended"]


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
