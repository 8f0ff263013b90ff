"""The driver JVM's class archive: `make setup` builds it, every session starts from it."""

from __future__ import annotations

import subprocess
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
    options = driver_java_options(SparkSettings()).split()
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
