"""An HDFS for tests: Hadoop's MiniDFSCluster in a JVM of its own (``MiniHdfs.java``).

Its jars come from ``make setup`` (``.jars/hdfs-minicluster``, the Hadoop version PySpark
ships). Started once by the tests that need it; stopped by closing its standard input, and
killed by PID if it does not stop.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JARS = ROOT / ".jars" / "hdfs-minicluster"
PROGRAM = Path(__file__).with_name("MiniHdfs.java")


@contextlib.contextmanager
def mini_hdfs(base: Path, timeout: float = 120.0) -> Iterator[str]:
    """Start a NameNode and a DataNode under ``base``; yields ``hdfs://127.0.0.1:<port>``."""
    java = shutil.which("java")
    if java is None or not any(JARS.glob("hadoop-client-minicluster-*.jar")):
        pytest.fail(f"the HDFS minicluster needs java and {JARS} (run `make setup`)")
    log = (base / "mini-hdfs.log").open("w")
    process = subprocess.Popen(
        [java, "-Xmx512m", "-cp", f"{JARS}/*", str(PROGRAM), str(base / "dfs"), "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def _read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=_read, daemon=True).start()
    try:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the HDFS minicluster did not start in {timeout:.0f} s: see {log.name}")
        if not line.startswith("READY "):
            pytest.fail(f"the HDFS minicluster failed to start: see {log.name}")
        yield line.split()[1]
    finally:
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
