"""The driver JVM's class archive: Spark starts on about half the CPU (JDK class data sharing).

Before its first batch a processor's driver JVM loads, parses and verifies thousands of classes
from Spark's ~290 jars. An application class-data-sharing archive (JDK 13+, ``-XX:
ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` on every start) holds them parsed and
verified, mapped into each new JVM. Measured here (a session that has run one job, alternating,
load 5-6): 7.3-8.2 CPU-s of the JVM with the archive against 13.1-13.8 without, 4.9 s to the
first result against ~9 s.

``make setup`` builds it once (``python -m refold.processors.runtime.class_archive``, ~30 s: a
short Spark application with a Python streaming source, ``foreachBatch`` and ``mapInArrow``, the
shapes a processor runs, whose JVM writes the classes it loaded when it exits). Every session
then passes it to its driver JVM (:func:`driver_java_options`). The JVM checks the archive
against its own build and class path (each jar's size and time) and ignores one that does not
match, with one warning line on stderr: a stale archive costs the speed-up, never a result.
Rebuild after changing the JDK or PySpark (``make setup`` does, as the venv or jars change).
JDK 17 archives no class from a class path with a space in it (a checkout or venv under
``My Projects/``): the archive then holds the JDK's own classes only, and Spark starts without
most of the gain (JDK 25 archives them).

Only the driver's JVM uses it: a local master runs the executors in that JVM; a cluster's
executors start from their own workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from refold.contracts.settings import SparkSettings
from refold.processors.runtime.jvm_options import path_option

__all__ = ["archive_path", "build_archive", "driver_java_options", "main"]

# Next to the jars `make setup` fetches (`.jars/` of the checkout, which git ignores).
_CHECKOUT_ARCHIVES = Path(__file__).resolve().parents[2] / ".jars/jvm"
# JVM warnings (a stale archive's among them) go to stderr: by default the JVM writes them to
# stdout, which carries a command's answer (replay prints JSON there).
_LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"
# Writing the archive warns of every class it skips (signed jars' among them): errors only.
_QUIET_DUMP = "-Xlog:disable -Xlog:all=error:stderr"
_JVM_EXIT_TIMEOUT_S = 300.0


def archive_path(spark: SparkSettings) -> Path:
    """Where the archive of this PySpark version is (it may not exist).

    ``spark.class_archive`` if set, else ``.jars/jvm/spark-<pyspark version>.jsa`` of the
    checkout.
    """
    if spark.class_archive is not None:
        return spark.class_archive
    import pyspark

    return _CHECKOUT_ARCHIVES / f"spark-{pyspark.__version__}.jsa"


def driver_java_options(spark: SparkSettings) -> str:
    """The driver JVM's options for the archive: empty when there is none."""
    path = archive_path(spark)
    if not path.is_file():
        return ""
    return f"{path_option('-XX:SharedArchiveFile=', path)} {_LOG_TO_STDERR}"


def build_archive(spark: SparkSettings) -> Path:
    """Run a short Spark application whose JVM writes the classes it loaded to the archive.

    Written under a temporary name and renamed when the JVM has exited, so a session never
    sees half an archive.

    Returns:
        The archive's path.

    Raises:
        RuntimeError: The application failed, or its JVM wrote no archive.
    """
    from refold.processors.runtime.class_archive_warm_up import warm_up
    from refold.processors.runtime.spark import build_spark_session

    path = archive_path(spark)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a session must not start from the archive it replaces
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    session = build_spark_session(
        "refold-class-archive",
        spark,
        java_options=f"{path_option('-XX:ArchiveClassesAtExit=', partial)} {_QUIET_DUMP}",
    )
    gateway = session.sparkContext._gateway  # noqa: SLF001 - PySpark's link to its JVM
    jvm = gateway.proc  # type: ignore[union-attr]
    try:
        with tempfile.TemporaryDirectory(prefix="refold-class-archive-") as checkpoint:
            warm_up(session, Path(checkpoint))
    finally:
        session.stop()
        # The gateway JVM exits when its stdin closes; it writes the archive as it exits.
        jvm.stdin.close()
        jvm.wait(timeout=_JVM_EXIT_TIMEOUT_S)
    if not partial.is_file() or partial.stat().st_size == 0:
        msg = f"the JVM wrote no class archive to {partial}"
        raise RuntimeError(msg)
    partial.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Build the archive of the settings' Spark (``REFOLD_SPARK__*``); 0 when built."""
    parser = argparse.ArgumentParser(
        prog="python -m refold.processors.runtime.class_archive",
        description=(
            "Build the driver JVM's class archive (JDK class data sharing), which every Spark "
            "session of refold then starts from: about half the JVM's start-up CPU. "
            "Written to REFOLD_SPARK__CLASS_ARCHIVE, default .jars/jvm/ of the checkout."
        ),
    )
    parser.parse_args(argv)
    from refold.contracts.settings import StackSettings

    spark = StackSettings().spark
    print(f"building the driver JVM's class archive {archive_path(spark)} (~30 s, once)")
    started = time.monotonic()
    try:
        path = build_archive(spark)
    except RuntimeError as exc:
        print(f"class archive not built: {exc}. Spark starts without it (slower).", file=sys.stderr)
        return 1
    size_mb = path.stat().st_size / 1e6
    print(f"built {path} ({size_mb:.0f} MB) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
