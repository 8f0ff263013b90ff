"""SparkSession construction for processors and tests (driver side only).

One session is one Spark application: several processors' streaming queries share it, each in
its own FAIR scheduler pool (``sc.setLocalProperty("spark.scheduler.pool", name)`` in the thread
that starts the query). The master comes from :class:`refold.contracts.settings.SparkSettings`:
``local[2]`` runs in-process; on a cluster (``spark://``, ``yarn``, ``k8s://``) the user code
named in ``ship`` is zipped and sent to the executors with ``SparkContext.addPyFile``.

Under ``spark-submit`` (the driver's JVM already exists: ``PYSPARK_GATEWAY_PORT`` is set), what
spark-submit was given (``--master``, ``--conf``, ``spark-defaults.conf``) wins over the settings;
the settings fill in the rest.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from refold.contracts.logconfig import LOG_FORMAT_ENV, LOG_LEVEL_ENV
from refold.contracts.settings import SparkSettings
from refold.processors.errors import ProcessorConfigError
from refold.processors.runtime.checkpoints import is_local
from refold.processors.runtime.class_archive import driver_java_options
from refold.processors.runtime.spark_archives import with_worker_startup
from refold.processors.runtime.spark_scratch import driver_scratch, java_temp_dir_option

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

__all__ = [
    "build_spark_session",
    "check_kafka_connector",
    "connector_jars",
    "is_local_master",
    "kafka_connector_version",
    "package_archive",
    "ship_packages",
    "spark_conf",
]

# Spark's own archives and caches are never user code.
_SKIPPED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".git"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
# A fixed timestamp for every zip entry: the same code gives the same archive, byte for byte.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
# Where `make setup` puts Spark's Kafka connector (deploy/jars/spark/pom.xml).
_CHECKOUT_JARS = Path(__file__).resolve().parents[2] / ".jars/spark"
_CONNECTOR_PREFIX = "spark-sql-kafka-0-10_2.13-"
_LOCAL_CHECKPOINT_FILES = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def is_local_master(master: str) -> bool:
    """True for an in-process master (``local``, ``local[N]``, ``local[*]``, ``local-cluster``)."""
    return master.startswith("local")


def spark_conf(app_name: str, spark: SparkSettings, java_options: str = "") -> dict[str, str]:
    """The Spark configuration refold applies to its sessions (no JVM).

    Args:
        app_name: ``spark.app.name``, shown in Spark's logs and the master's UI.
        spark: Where to run and how much of the cluster to take.
        java_options: More options for the driver's JVM. Without them, the driver starts from
            the class archive if there is one (:mod:`~refold.processors.runtime.class_archive`).

    Returns:
        Spark properties, ``spark.master`` included.
    """
    conf = {
        "spark.master": spark.master,
        "spark.app.name": app_name,
        # Several processors' queries share one application, each in its own pool: FAIR
        # scheduling keeps a busy query from starving the others (pools are created on first
        # use with weight 1, so no allocation file is needed).
        "spark.scheduler.mode": "FAIR",
        "spark.driver.memory": spark.driver_memory,
        # Ignored by local masters; on a cluster, one executor's heap.
        "spark.executor.memory": spark.executor_memory,
        # No UI: nothing to look at in tests and demos, and it saves a port and memory.
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Tiny batches: the default 200 shuffle partitions would be 200 empty tasks.
        "spark.sql.shuffle.partitions": "2",
        # Python workers are reused, so per-process Kafka/Redis clients survive across tasks.
        "spark.python.worker.reuse": "true",
        # Drops pyspark.zip from the workers' path: saves ~55 ms per task (spark_archives.py).
        # The executors' Python must import refold for it (the same virtualenv, or refold
        # installed there); otherwise pass --conf spark.python.daemon.module=pyspark.daemon.
        "spark.python.daemon.module": "refold.processors.runtime.spark_daemon",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python workers talk to their JVM over Unix sockets rather than TCP. Over loopback TCP
        # a task's first input batch waited 40 ms (Nagle's algorithm against delayed ACKs: a
        # small write held until the last one is acknowledged), in every task of every batch.
        "spark.python.unix.domain.socket.enabled": "true",
        # Spark pools Python workers per environment, and SQL's Python runners (mapInArrow)
        # add SPARK_SIMPLIFIED_TRACEBACK to theirs where RDD jobs do not: two daemons, two
        # sets of warm workers (each with its own Kafka and Redis clients), and a fold's
        # batch 1 (an RDD job, planned by the driver) met cold workers after batch 0
        # (mapInArrow). Without it both share one pool; tracebacks keep PySpark's frames.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        # Streaming progress is reported by refold itself; keep Spark's own logs quiet.
        "spark.sql.streaming.metricsEnabled": "false",
        "spark.driver.extraJavaOptions": " ".join(
            ["-Dlog4j2.level=warn", java_options or driver_java_options(spark)]
        ).strip(),
    }
    if not spark.checkpoint_url or is_local(spark.checkpoint_url):
        # Local checkpoints through Hadoop's FileSystem API rather than Spark's default
        # FileContext: without Hadoop's native library, FileContext starts a `chmod` for each
        # file it creates and a `readlink` for each side of a rename (the batch's offsets and
        # commit logs: ~10 processes a batch, 30-50 ms of each batch's cycle and a tenth of a
        # core at 5k events/s). A local rename is atomic, which is all Spark asks of either.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = _LOCAL_CHECKPOINT_FILES
    if spark.cores_max is not None:
        # Without it one application takes every core of the cluster and the next one waits.
        conf["spark.cores.max"] = str(spark.cores_max)
    jars = connector_jars(spark)
    if jars:
        # Local paths: Spark serves them to a cluster's executors itself.
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    return conf


def connector_jars(spark: SparkSettings) -> list[Path]:
    """The jars of ``spark.jars_dir`` (default ``.jars/spark`` of the checkout); may be none."""
    folder = spark.jars_dir or _CHECKOUT_JARS
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def kafka_connector_version(jars: Sequence[Path]) -> str | None:
    """The version of Spark's Kafka connector among ``jars`` (None: it is not there)."""
    for jar in jars:
        if jar.name.startswith(_CONNECTOR_PREFIX) and jar.name.endswith(".jar"):
            return jar.name[len(_CONNECTOR_PREFIX) : -len(".jar")]
    return None


def check_kafka_connector(spark: SparkSettings) -> None:
    """Refuse the ``kafka`` source when its connector is missing or of another Spark version.

    Under spark-submit the jars may come from ``--packages`` or ``--jars`` instead: nothing
    is checked there (Spark itself names a missing data source).

    Raises:
        ProcessorConfigError: No connector jar, or one whose version is not PySpark's.
    """
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    import pyspark

    folder = spark.jars_dir or _CHECKOUT_JARS
    found = kafka_connector_version(connector_jars(spark))
    if found is None:
        msg = (
            f"source_format kafka needs Spark's Kafka connector, and {folder} holds no "
            f"{_CONNECTOR_PREFIX}*.jar. Operator action: run `make setup` (it fetches it with "
            "mvn from deploy/jars/pom.xml), set REFOLD_SPARK__JARS_DIR to a folder with it, "
            "or use source_format refold_kafka_ranges."
        )
        raise ProcessorConfigError(msg)
    if found != pyspark.__version__:
        msg = (
            f"Spark's Kafka connector in {folder} is {found}, but PySpark is "
            f"{pyspark.__version__}: a connector must match its Spark. Operator action: set "
            "spark.version in deploy/jars/pom.xml to PySpark's version and run `make setup`."
        )
        raise ProcessorConfigError(msg)


def _submitted_conf() -> dict[str, str]:
    """What ``spark-submit`` set for this driver; empty when not run by spark-submit."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    from pyspark import SparkConf, SparkContext

    # Connects to the JVM spark-submit started (nothing is launched), whose system properties
    # hold spark-submit's settings; SparkConf() sees them only once connected.
    SparkContext._ensure_initialized()  # noqa: SLF001 - no public way to connect first
    return dict(SparkConf().getAll())


def build_spark_session(
    app_name: str,
    spark: SparkSettings | None = None,
    ship: Sequence[str] = (),
    *,
    java_options: str = "",
) -> SparkSession:
    """Build (or get) the SparkSession of this process.

    Driver side only. Not idempotent in one respect: ``getOrCreate`` returns an existing session
    unchanged (its master and memory stay), but ``ship`` is applied to it again (shipping the same
    code twice is harmless).

    Args:
        app_name: ``spark.app.name``.
        spark: Master, cores, memory; default :class:`SparkSettings` (``local[2]``). Under
            spark-submit, spark-submit's own settings win (see the module docstring).
        ship: Top-level importable package or module names (``["refold", "customer_pkg"]``)
            zipped and added to the executors' path when the master is not local, so user code
            that is not installed on the cluster can be imported by tasks.
        java_options: More options for the driver's JVM, instead of the class archive's (see
            :func:`spark_conf`). Ignored under spark-submit, whose JVM is already running.

    Returns:
        The session, with the refold Kafka sources registered.

    Raises:
        ProcessorConfigError: A name in ``ship`` cannot be imported (or is not top-level).
    """
    from pyspark.sql import SparkSession

    settings = spark if spark is not None else SparkSettings()
    # Executors must run the same interpreter (and virtualenv) as the driver; the driver sends
    # PYSPARK_PYTHON to them with every Python function, on a cluster too.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = _submitted_conf()
    builder = SparkSession.builder
    conf = spark_conf(app_name, settings, java_options)
    # Temporary files where a kill -9 does not leave them for good (spark_scratch.py): Spark's,
    # and the JVM's own (its Python workers' sockets among them).
    scratch = driver_scratch()
    conf["spark.local.dir"] = str(scratch)
    driver_options = conf["spark.driver.extraJavaOptions"]
    if "-Djava.io.tmpdir=" not in driver_options:  # a caller's own choice stays
        driver_options = f"{driver_options} {java_temp_dir_option(scratch)}".strip()
    conf["spark.driver.extraJavaOptions"] = driver_options
    for name in (LOG_FORMAT_ENV, LOG_LEVEL_ENV):
        # Executors' Python workers log like the driver (spark_daemon.log_like_the_driver);
        # a local master's inherit the environment anyway, a cluster's get it from here.
        if name in os.environ:
            conf[f"spark.executorEnv.{name}"] = os.environ[name]
    for key, value in conf.items():
        # spark-submit's choices win, except the name (spark-submit's default is the file name).
        if key == "spark.app.name" or key not in submitted:
            builder = builder.config(key, value)
    # The JVM getOrCreate may start passes its environment to every Python process it starts.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = with_worker_startup(saved or "")
    try:
        session = builder.getOrCreate()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    session.sparkContext.setLogLevel("WARN")
    _quiet_expected_warnings(session)
    if not is_local_master(session.sparkContext.master or "local"):
        ship_packages(session.sparkContext, ship)
    from refold.processors.runtime.kafka_source import KafkaDataSource, KafkaRangesDataSource

    session.dataSource.register(KafkaDataSource)
    session.dataSource.register(KafkaRangesDataSource)
    return session


# Spark loggers whose WARN lines are expected in refold's operation, not news: "Current batch
# is falling behind" comes every few batches under a 250 ms trigger whenever a batch takes
# longer (the trigger only keeps idle polling cheap; lag is reported by refold's own stats).
_EXPECTED_WARNINGS = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",  # Spark 4.1
    "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor",  # earlier versions
)


# Messages of Spark's that are expected, denied one by one (their loggers' other lines stay).
# DAGScheduler's "Failed to cancel job group <id>. Cannot find active jobs for it." came at
# every stop: stopping a streaming query cancels its job group whether a job runs or not
# (refold lets the batch in flight finish first), so there is nothing to cancel and nothing
# failed. A real failure of a job is logged by the query, not by this line.
_EXPECTED_MESSAGES = (r"(?s)Failed to cancel job group .* Cannot find active jobs for it\..*",)


def _quiet_expected_warnings(session: SparkSession) -> None:
    """Raise :data:`_EXPECTED_WARNINGS` to ERROR, deny :data:`_EXPECTED_MESSAGES` (driver side).

    Best effort: a logging nicety must never stop a processor.
    """
    try:
        jvm = session.sparkContext._jvm  # noqa: SLF001 - PySpark's own gateway to log4j
        log4j = jvm.org.apache.logging.log4j  # type: ignore[union-attr]
        for name in _EXPECTED_WARNINGS:
            log4j.core.config.Configurator.setLevel(name, log4j.Level.ERROR)
        context = log4j.LogManager.getContext(False)
        result = getattr(log4j.core, "Filter$Result")
        for pattern in _EXPECTED_MESSAGES:
            deny = log4j.core.filter.RegexFilter.createFilter(
                pattern, None, False, result.DENY, result.NEUTRAL
            )
            deny.start()
            # A context-wide filter (a logger's own would need a LoggerConfig of its own); it
            # is asked only about records logged, and denies only what matches.
            context.getConfiguration().addFilter(deny)
        context.updateLoggers()
    except Exception:
        return


def ship_packages(sc: SparkContext, names: Sequence[str]) -> list[Path]:
    """Zip each named package (or module) and add it to every executor's Python path.

    Driver side. The archives live in a private temporary directory until this process exits
    (Spark's file server serves them from there, also to executors that join later).

    Args:
        sc: The application's context.
        names: Top-level importable names.

    Returns:
        The archives added, in the order of ``names``.

    Raises:
        ProcessorConfigError: A name cannot be imported, or is not top-level.
    """
    archives = [package_archive(name, _archive_dir()) for name in names]
    for archive in archives:
        sc.addPyFile(str(archive))
    return archives


@functools.cache
def _archive_dir() -> Path:
    """One private directory per process, removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="refold-ship-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _sources(name: str) -> list[tuple[str, Path]]:
    """``(path in the archive, file)`` for every file of the package or module ``name``."""
    if not name.isidentifier():
        msg = (
            f"cannot ship {name!r}: only top-level package or module names can be shipped. "
            f"Operator action: ship {name.split('.')[0]!r} instead."
        )
        raise ProcessorConfigError(msg)
    cause: Exception | None = None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        spec, cause = None, exc
    if spec is None:
        msg = (
            f"cannot ship {name!r}: the driver cannot import it. Operator action: install it, "
            "or put its parent directory on PYTHONPATH, or remove it from the list to ship."
        )
        raise ProcessorConfigError(msg) from cause
    if spec.submodule_search_locations:  # a package (a namespace package may have several)
        found: dict[str, Path] = {}
        for location in spec.submodule_search_locations:
            root = Path(location)
            for path in _walk(root):
                found.setdefault(f"{name}/{path.relative_to(root).as_posix()}", path)
        return sorted(found.items())
    if spec.origin is None or not spec.has_location:
        msg = (
            f"cannot ship {name!r}: it has no source file (a built-in module?). "
            "Operator action: remove it from the list to ship."
        )
        raise ProcessorConfigError(msg)
    origin = Path(spec.origin)
    return [(origin.name, origin)]


def _walk(root: Path) -> Iterator[Path]:
    # followlinks: in a source checkout refold/contracts etc. link to the top-level folders.
    for directory, subdirs, files in os.walk(root, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
        for file in sorted(files):
            if not file.endswith(_SKIPPED_SUFFIXES):
                yield Path(directory, file)


def package_archive(name: str, directory: Path) -> Path:
    """Zip the package or module ``name`` (as the driver imports it) into ``directory``.

    The file is ``<name>-<digest>.zip``, the digest over the archive's paths and contents: the
    same code gives the same file (written once), changed code a new name, because Spark refuses
    a second file of one name from another path.

    Args:
        name: A top-level importable name.
        directory: Where the archive is written.

    Returns:
        The archive's path.

    Raises:
        ProcessorConfigError: ``name`` cannot be imported, or is not top-level.
    """
    sources = _sources(name)
    digest = hashlib.sha256()
    contents = []
    for arcname, path in sources:
        data = path.read_bytes()
        contents.append((arcname, data))
        digest.update(arcname.encode() + b"\0" + hashlib.sha256(data).digest())
    archive = Path(directory) / f"{name}-{digest.hexdigest()[:16]}.zip"
    if archive.exists():
        return archive
    partial = archive.with_suffix(".tmp")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        for arcname, data in contents:
            out.writestr(zipfile.ZipInfo(arcname, _ZIP_EPOCH), data, zipfile.ZIP_DEFLATED)
    partial.replace(archive)
    return archive
