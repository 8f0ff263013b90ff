"""The driver JVM's class archive: `make setup` builds it, every session starts from it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from refold.contracts.settings import SparkSettings
from refold.processors.runtime.class_archive import archive_path, driver_java_options


def _archive() -> Path:
    archive = archive_path(SparkSettings())
    assert archive.is_file(), f"{archive} missing: `make setup` builds it (.jars/class-archive.log)"
    return archive


def test_the_session_starts_from_the_archive_make_setup_built(spark) -> None:
    archive = _archive()
    jvm = spark.sparkContext._gateway.proc  # PySpark's JVM process
    maps = Path(f"/proc/{jvm.pid}/maps").read_text()
    assert str(archive.resolve()) in maps


def test_an_archive_of_another_class_path_leaves_stdout_clean_and_the_jvm_running(
    tmp_path: Path,
) -> None:
    # The archive holds Spark's class path; a JVM with another one cannot use it, as a driver
    # cannot after the venv is reinstalled: it warns and runs on.
    options = shlex.split(driver_java_options(SparkSettings()))
    assert f"-XX:SharedArchiveFile={_archive()}" in options
    done = subprocess.run(
        ["java", *options, "-cp", str(tmp_path), "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout == ""  # the JVM's warning goes to stderr: stdout carries answers
    assert "unable to use shared archive" in done.stderr.lower()


_SESSION_SCRIPT = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from refold.processors.runtime.spark import build_spark_session

    spark = build_spark_session("refold-space-in-paths")
    # A Python worker too: Spark makes its Unix socket in the JVM's temp dir.
    assert spark.range(10).rdd.map(lambda row: row.id * 2).sum() == 90
    jvm = spark.sparkContext._gateway.proc
    print(spark.sparkContext._jvm.System.getProperty("java.io.tmpdir"))
    archive = Path(os.environ["REFOLD_SPARK__CLASS_ARCHIVE"]).resolve()
    print(str(archive) in Path(f"/proc/{jvm.pid}/maps").read_text())
    spark.stop()
    """
)


def test_a_session_starts_when_its_archive_and_temp_dir_have_spaces_in_their_paths() -> None:
    # Spark's launcher splits the driver's Java options like a shell: a bare path with a space
    # was two arguments, and the JVM did not start at all.
    with tempfile.TemporaryDirectory(prefix="refold space ") as spaced:
        archive = Path(spaced, "class archive", "spark.jsa")
        archive.parent.mkdir()
        archive.symlink_to(_archive())
        env = {**os.environ, "TMPDIR": spaced, "REFOLD_SPARK__CLASS_ARCHIVE": str(archive)}
        done = subprocess.run(
            [sys.executable, "-c", _SESSION_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        temp_dir, archive_mapped = done.stdout.splitlines()[-2:]
        # The JVM's temp dir is the driver's scratch dir under TMPDIR, space and all.
        assert temp_dir.startswith(f"{spaced}/refold-spark-"), temp_dir
        assert archive_mapped == "True"  # the JVM started from the archive it was given
