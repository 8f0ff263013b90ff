"""A driver's scratch directory: its own, by pid; those of ended processes are removed; the
JVM's temporary directory while a socket's path fits in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from refold.processors.runtime.spark_scratch import (
    driver_scratch,
    java_temp_dir_option,
    sweep_ended,
)


def _ended_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_a_driver_gets_its_own_directory_and_those_of_ended_drivers_are_removed(tmp_path):
    root = tmp_path / "scratch"
    ended = root / str(_ended_pid())
    (ended / "spark-1" / "userFiles-2").mkdir(parents=True)
    (ended / "spark-1" / "userFiles-2" / "connector.jar").write_bytes(b"x" * 1024)
    running = root / "1"  # init: running, and not ours
    running.mkdir()
    other = root / "notes"  # not a driver's: left alone
    other.mkdir()

    mine = driver_scratch(root)

    assert mine == root / str(os.getpid())
    assert mine.is_dir()
    assert not ended.exists()
    assert running.is_dir()
    assert other.is_dir()
    assert sweep_ended(root) == []  # nothing more to remove; this process's stays
    assert mine.is_dir()


def test_the_scratch_directory_is_the_jvms_temp_dir_while_a_socket_path_fits_in_it():
    short = Path("/var/tmp/refold-spark-0/12345")  # noqa: S108 - a name, nothing made
    assert java_temp_dir_option(short) == f"-Djava.io.tmpdir={short}"
    # A socket's path holds 107 bytes; Spark's name for one takes 43 after the directory.
    longest = Path("/" + "d" * 63)
    assert java_temp_dir_option(longest) == f"-Djava.io.tmpdir={longest}"
    assert java_temp_dir_option(Path("/" + "d" * 64)) == ""
