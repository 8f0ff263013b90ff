"""`refold cluster up|status|down` for real: a Spark standalone master and worker from the wheel.

A driver (its own process, so this test run keeps no JVM) submits a job whose tasks import a
package that is installed nowhere: only shipping it with ``build_spark_session(ship=...)`` lets
the executors import it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from refold.deploy.cluster import ClusterError, ClusterSpec, SparkCluster
from refold.deploy.local_stack import free_port
from tests.support.waiting import assert_eventually

DRIVER = textwrap.dedent(
    """
    import json, os, sys

    master, package_root, package = sys.argv[1:4]
    sys.path.insert(0, package_root)  # the driver imports the package from here, nobody else

    from refold.contracts.settings import SparkSettings
    from refold.processors.runtime.spark import build_spark_session

    spark = build_spark_session(
        "refold-cluster-test", SparkSettings(master=master, cores_max=1), ship=[package]
    )

    def tag(batches):
        import importlib
        import pyarrow as pa

        user = importlib.import_module(package)
        for batch in batches:
            n = batch.num_rows
            yield pa.RecordBatch.from_pydict({
                "id": batch.column(0),
                "tagged": [user.tag(v) for v in batch.column(0).to_pylist()],
                "origin": [user.__file__] * n,
                "pid": [os.getpid()] * n,
                "python": [sys.executable] * n,
                "daemon": ["refold.processors.runtime.sink" in sys.modules] * n,
                "unix": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower() == "true"] * n,
            })

    schema = (
        "id long, tagged string, origin string, pid long, python string, daemon boolean, "
        "unix boolean"
    )
    rows = [r.asDict() for r in spark.range(4).mapInArrow(tag, schema).collect()]
    conf = spark.sparkContext.getConf()
    print(json.dumps({
        "rows": rows,
        "driver_pid": os.getpid(),
        "app_id": spark.sparkContext.applicationId,
        "scheduler": conf.get("spark.scheduler.mode"),
        "cores_max": conf.get("spark.cores.max"),
    }))
    spark.stop()
    """
)


def _refold(*argv: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "refold.deploy.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _gone(pid: int) -> bool:
    """True when no process of the group ``pid`` (a daemon and its executors) is left."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _user_package(root, name):
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .rules import tag\n")
    (package / "rules.py").write_text("def tag(value):\n    return f'user-{value * 10}'\n")


def test_cluster_runs_shipped_user_code_and_down_leaves_no_process(tmp_path):
    master_port, webui_port, worker_webui_port = free_port(), free_port(), free_port()
    state = ["--state-dir", str(tmp_path / "state")]
    cluster_dir = tmp_path / "state" / "cluster"
    package = f"refold_user_{uuid.uuid4().hex[:8]}"
    _user_package(tmp_path / "src", package)
    (tmp_path / "driver.py").write_text(DRIVER)
    up = _refold(
        "cluster",
        "up",
        *state,
        "--master-port",
        str(master_port),
        "--webui-port",
        str(webui_port),
        "--worker-webui-port",
        str(worker_webui_port),
    )
    try:
        assert up.returncode == 0, up.stderr
        master_url = f"spark://127.0.0.1:{master_port}"
        assert f"export REFOLD_SPARK__MASTER={master_url} REFOLD_SPARK__CORES_MAX=1" in up.stdout
        assert f"stop it: refold cluster down --state-dir {tmp_path / 'state'}\n" in up.stdout
        status = _refold("cluster", "status", *state, timeout=30)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("running (pid") == 2
        assert "workers alive: 1" in status.stdout
        daemons = [d.pid for d in SparkCluster(cluster_dir).status()]

        driver = subprocess.run(
            [
                sys.executable,
                str(tmp_path / "driver.py"),
                master_url,
                str(tmp_path / "src"),
                package,
            ],
            capture_output=True,
            text=True,
            timeout=150,
            cwd=tmp_path,
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        # The last JSON line: Spark may log a WARN to stdout while the context stops.
        lines = driver.stdout.strip().splitlines()
        result = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
        rows = sorted(result["rows"], key=lambda r: r["id"])
        assert [r["tagged"] for r in rows] == ["user-0", "user-10", "user-20", "user-30"]
        # The tasks ran in executors of the cluster, with the driver's interpreter, the refold
        # worker daemon talking to its executor over a Unix socket, and the user package from
        # the shipped zip.
        assert all(r["pid"] != result["driver_pid"] for r in rows)
        assert all(r["python"] == sys.executable for r in rows)
        assert all(r["daemon"] and r["unix"] for r in rows)
        assert all(f"{package}-" in r["origin"] and ".zip" in r["origin"] for r in rows)
        assert (result["scheduler"], result["cores_max"]) == ("FAIR", "1")
        apps = SparkCluster(cluster_dir).master_state()
        assert apps is not None
        assert [a["id"] for a in apps["completedapps"]] == [result["app_id"]]
        executors = [r["pid"] for r in rows]
    finally:
        down = _refold("cluster", "down", *state, timeout=60)
    assert down.returncode == 0, down.stderr
    assert "stopped: master, worker" in down.stdout
    for pid in [*daemons, *executors]:
        assert_eventually(lambda pid=pid: _gone(pid), timeout=10, message=f"{pid} still runs")
    status = _refold("cluster", "status", *state, timeout=30)
    assert status.returncode == 3
    assert "running" not in status.stdout


def test_a_taken_port_is_a_clear_error_and_starts_nothing(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = SparkCluster(tmp_path, ClusterSpec(webui_port=taken, master_port=free_port()))
        with pytest.raises(ClusterError, match=f"port {taken} is taken.*--webui-port"):
            cluster.start()
    assert not any(daemon.running for daemon in cluster.status())
    assert not list(tmp_path.glob("*.pid"))
