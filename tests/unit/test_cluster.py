"""The pure parts of `refold cluster` and of the Spark session: argv, env, pid files, conf, zips."""

from __future__ import annotations

import argparse
import os
import shlex
import zipfile
import zipimport
from pathlib import Path

import pyspark
import pytest

from refold.contracts.settings import SparkSettings
from refold.deploy.cli import build_parser
from refold.deploy.cluster import (
    ClusterSpec,
    SparkCluster,
    daemon_command,
    daemon_env,
    parse_pid_file,
)
from refold.deploy.cluster_cli import add_cluster_commands
from refold.deploy.processes import stop_hint
from refold.processors.errors import ProcessorConfigError
from refold.processors.runtime.spark import is_local_master, package_archive, spark_conf

SPARK_HOME = Path("/opt/spark")
# Above Linux's pid_max (2**22): never a live process.
DEAD_PID = 2**22 + 17


def test_the_master_command_binds_its_ports_on_loopback():
    spec = ClusterSpec(master_port=27077, webui_port=28080)
    assert daemon_command("master", spec, SPARK_HOME, Path("w")) == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        "27077",
        "--webui-port",
        "28080",
    ]


def test_the_worker_command_offers_its_cores_and_memory_to_the_master():
    spec = ClusterSpec(
        master_port=27077, worker_webui_port=28081, worker_cores=1, worker_memory="1g"
    )
    argv = daemon_command("worker", spec, SPARK_HOME, Path("/s/cluster/work"))
    assert argv[:3] == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.worker.Worker",
        "spark://127.0.0.1:27077",
    ]
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert options == {
        "--cores": "1",
        "--memory": "1g",
        "--host": "127.0.0.1",
        "--webui-port": "28081",
        "--work-dir": "/s/cluster/work",
    }


def test_daemons_never_move_to_another_port_and_keep_the_callers_options():
    base = {"PATH": "/bin", "SPARK_MASTER_OPTS": "-Dx=1"}
    master = daemon_env("master", ClusterSpec(), SPARK_HOME, base)
    assert master["PATH"] == "/bin"
    assert master["SPARK_HOME"] == "/opt/spark"
    assert master["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert master["SPARK_MASTER_OPTS"].split() == [
        "-Dx=1",
        "-Dspark.port.maxRetries=0",
        "-Dspark.master.rest.enabled=false",
    ]
    worker = daemon_env("worker", ClusterSpec(), SPARK_HOME, {})
    assert worker["SPARK_WORKER_OPTS"] == "-Dspark.port.maxRetries=0"
    assert "SPARK_MASTER_OPTS" not in worker
    assert worker["SPARK_DAEMON_MEMORY"] == "512m"
    assert (
        daemon_env("worker", ClusterSpec(), SPARK_HOME, {"SPARK_DAEMON_MEMORY": "1g"})[
            "SPARK_DAEMON_MEMORY"
        ]
        == "1g"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123 17077 18080\n", (123, [17077, 18080])),
        ("123 18081", (123, [18081])),
        ("123", (123, [])),
        ("", (None, [])),
        ("garbage 1", (None, [])),
        ("123 x 5", (123, [])),
    ],
)
def test_pid_files_hold_the_pid_then_the_ports(text, expected):
    assert parse_pid_file(text) == expected


def test_status_reports_the_recorded_ports_and_a_dead_pid_as_stopped(tmp_path):
    (tmp_path / "master.pid").write_text(f"{DEAD_PID} 27077 28080\n")
    (tmp_path / "worker.pid").write_text(f"{DEAD_PID} 28081\n")
    master, worker = SparkCluster(tmp_path).status()
    assert (master.role, master.pid, master.port, master.webui_port) == (
        "master",
        DEAD_PID,
        27077,
        28080,
    )
    assert (worker.role, worker.port, worker.webui_port) == ("worker", None, 28081)
    assert not master.running
    assert not worker.running
    assert master.log_file == tmp_path / "master.log"


def test_stop_leaves_a_reused_pid_alone_and_forgets_it(tmp_path):
    # This test's own process: alive, but not a Spark daemon (a PID reused by another program).
    (tmp_path / "master.pid").write_text(f"{os.getpid()} 27077 28080\n")
    cluster = SparkCluster(tmp_path)
    assert not cluster.status()[0].running
    assert cluster.stop() == []
    assert not (tmp_path / "master.pid").exists()


def _parse(*argv, env=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=".state")
    add_cluster_commands(parser.add_subparsers(dest="command", required=True), env=env or {})
    return parser.parse_args(list(argv))


def test_cluster_options_default_from_the_environment_and_the_command_line_wins():
    env = {"REFOLD_CLUSTER_MASTER_PORT": "27000", "REFOLD_CLUSTER_WORKER_MEMORY": "1g"}
    args = _parse("cluster", "up", env=env)
    assert (args.master_port, args.webui_port, args.worker_memory) == (27000, 18080, "1g")
    assert (args.worker_webui_port, args.worker_cores) == (18081, 2)
    args = _parse("cluster", "up", "--master-port", "27001", "--worker-cores", "1", env=env)
    assert (args.master_port, args.worker_cores) == (27001, 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["--master-port", "0"],
        ["--webui-port", "70000"],
        ["--worker-cores", "0"],
        ["--worker-memory", "2 GB"],
    ],
)
def test_bad_cluster_options_are_usage_errors(argv):
    with pytest.raises(SystemExit):
        _parse("cluster", "up", *argv)


def test_the_state_dir_may_come_before_or_after_the_cluster_subcommand():
    parser = build_parser()
    assert parser.parse_args(["--state-dir", "a", "cluster", "status"]).state_dir == "a"
    assert (
        parser.parse_args(["--state-dir", "a", "cluster", "down", "--state-dir", "b"]).state_dir
        == "b"
    )


@pytest.mark.parametrize("command", ["refold down", "refold cluster down"])
def test_the_stop_hint_up_prints_names_the_state_dir_unless_it_is_the_default(command):
    assert stop_hint(command, ".state") == command
    spaced = "/home/me/My Projects/.state"
    argv = shlex.split(stop_hint(command, spaced))[1:]  # as a shell would pass it
    assert build_parser().parse_args(argv).state_dir == spaced


def test_spark_conf_from_settings():
    conf = spark_conf("app", SparkSettings())
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.app.name"] == "app"
    assert conf["spark.scheduler.mode"] == "FAIR"
    assert conf["spark.python.daemon.module"] == "refold.processors.runtime.spark_daemon"
    assert conf["spark.python.unix.domain.socket.enabled"] == "true"
    # One pool of Python workers for RDD jobs and mapInArrow (tests/spark/test_worker_pool.py).
    assert conf["spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"] == "false"
    assert "spark.cores.max" not in conf
    settings = SparkSettings(
        master="spark://h:7077", cores_max=1, executor_memory="3g", driver_memory="1g"
    )
    conf = spark_conf("app", settings)
    assert conf["spark.master"] == "spark://h:7077"
    assert conf["spark.cores.max"] == "1"
    assert conf["spark.executor.memory"] == "3g"
    assert conf["spark.driver.memory"] == "1g"


@pytest.mark.parametrize(
    ("checkpoint_url", "file_system_api"),
    [
        (None, True),
        ("/var/lib/refold/checkpoints", True),
        ("file:///var/lib/refold/checkpoints", True),
        ("hdfs://namenode:8020/refold", False),
        ("s3a://bucket/refold", False),
    ],
)
def test_local_checkpoints_are_written_through_hadoops_file_system_api(
    checkpoint_url, file_system_api
):
    # FileContext, Spark's default, starts chmod and readlink processes on a local disk.
    conf = spark_conf("app", SparkSettings(checkpoint_url=checkpoint_url))
    manager = conf.get("spark.sql.streaming.checkpointFileManagerClass")
    assert (manager is not None) == file_system_api
    if manager is not None:  # the class is in the Spark PySpark ships (it moved in Spark 4)
        jar = next((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar"))
        with zipfile.ZipFile(jar) as classes:
            assert manager.replace(".", "/") + ".class" in classes.namelist()


def test_spark_conf_starts_the_driver_from_the_class_archive_if_there_is_one(tmp_path):
    archive = tmp_path / "spark.jsa"
    settings = SparkSettings(class_archive=archive)
    assert "SharedArchiveFile" not in spark_conf("app", settings)["spark.driver.extraJavaOptions"]
    archive.write_bytes(b"archive")
    options = spark_conf("app", settings)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Dlog4j2.level=warn" in options
    dumping = spark_conf("app", settings, "-XX:ArchiveClassesAtExit=x.jsa")
    assert dumping["spark.driver.extraJavaOptions"] == (
        "-Dlog4j2.level=warn -XX:ArchiveClassesAtExit=x.jsa"
    )


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://h:7077", False),
        ("yarn", False),
    ],
)
def test_only_cluster_masters_get_shipped_code(master, local):
    assert is_local_master(master) is local


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    root = tmp_path / "src"
    package = root / "shipme_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__pycache__").mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (package / "data.json").write_text("{}")
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (root / "shipme_mod.py").write_text("X = 3\n")
    monkeypatch.syspath_prepend(str(root))
    return package


def test_a_package_is_zipped_without_caches_and_imports_from_the_zip(user_package, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    archive = package_archive("shipme_pkg", out)
    assert archive.name.startswith("shipme_pkg-")
    assert archive.suffix == ".zip"
    with zipfile.ZipFile(archive) as zipped:
        assert sorted(zipped.namelist()) == [
            "shipme_pkg/__init__.py",
            "shipme_pkg/data.json",
            "shipme_pkg/sub/__init__.py",
            "shipme_pkg/sub/mod.py",
        ]
    assert zipimport.zipimporter(str(archive)).find_spec("shipme_pkg") is not None


def test_the_same_code_gives_the_same_archive_and_changed_code_a_new_one(user_package, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    archive = package_archive("shipme_pkg", first)
    again = package_archive("shipme_pkg", second)
    assert archive.name == again.name
    assert archive.read_bytes() == again.read_bytes()
    (user_package / "sub" / "mod.py").write_text("def f():\n    return 3\n")
    assert package_archive("shipme_pkg", first).name != archive.name


def test_a_single_module_is_shipped_too(user_package, tmp_path):
    archive = package_archive("shipme_mod", tmp_path)
    with zipfile.ZipFile(archive) as zipped:
        assert zipped.namelist() == ["shipme_mod.py"]


@pytest.mark.parametrize("name", ["no_such_package_xyz", "shipme_pkg.sub", "os.path"])
def test_what_cannot_be_shipped_is_an_operator_error(user_package, tmp_path, name):
    with pytest.raises(ProcessorConfigError, match="Operator action"):
        package_archive(name, tmp_path)
