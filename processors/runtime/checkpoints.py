"""Spark checkpoints: where they live, and the few files of them refold reads or removes.

A checkpoint location is a local path or any URL Spark's Hadoop file systems take: ``file://``,
``hdfs://namenode:8020/refold``, ``s3a://bucket/refold`` (with hadoop-aws on the class path).
Spark writes the checkpoints; refold itself only

- reads a batch's entry in the offsets log and the query id (:mod:`~.offset_log`,
  :mod:`~.batch_stats`), on the driver, once per batch;
- asks whether a checkpoint has a batch (a generation resumes from it, or from its Redis
  positions);
- removes a stale one (a new generation, Redis behind the checkpoint) or a collected one (gc).

Local locations go through :mod:`pathlib`. Every other scheme goes through Hadoop's own
``FileSystem`` in a JVM: the Spark application's when this process runs one (the same
configuration Spark writes with: ``HADOOP_CONF_DIR``, ``core-site.xml``), else a small JVM on
PySpark's jars started once per process (``replay gc``, the HTTP admin route, a processor
before its session starts). That JVM is the one exception to "prefer a library": no Python
HDFS client reads ``hdfs://`` without the native libhdfs (pyarrow), a second configuration
(WebHDFS), or a second set of credentials per store (s3fs), and Spark already ships the client.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.processors.errors import ProcessorConfigError

if TYPE_CHECKING:
    from refold.contracts.settings import SparkSettings

__all__ = [
    "CheckpointFiles",
    "checkpoint_files",
    "checkpoint_location",
    "checkpoint_root",
    "has_batches",
    "is_local",
    "remove_generation_checkpoints",
    "remove_stale_checkpoint",
]

logger = logging.getLogger(__name__)


def is_local(location: str) -> bool:
    """A path, or a ``file://`` URL (read with :mod:`pathlib`)."""
    scheme, sep, _ = location.partition("://")
    return not sep or scheme == "file"


def checkpoint_root(state_dir: Path, spark: SparkSettings, *, key_prefix: str) -> str:
    """Where processors keep checkpoints: ``spark.checkpoint_url``, or ``<state dir>/checkpoints``.

    Under a key prefix other than the default, its own folder below that
    (:func:`prefix_folder`): two deployments sharing a root (one checkpoint URL, or one state
    directory) would otherwise share ``<root>/<processor>/g<N>``, and a new generation of one
    would remove the other's live checkpoint as stale.

    ``file://`` URLs become paths; other URLs are kept as given (without a trailing ``/``).

    Raises:
        ProcessorConfigError: A URL without a path, or of a form Hadoop cannot name.
    """
    base = _base_root(state_dir, spark)
    if key_prefix == DEFAULT_KEY_PREFIX:
        return base
    return f"{base}/{prefix_folder(key_prefix)}"


def _base_root(state_dir: Path, spark: SparkSettings) -> str:
    url = spark.checkpoint_url
    if not url:
        return str(state_dir / "checkpoints")
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme == "file":
        return rest
    if not scheme.isascii() or not scheme.replace("+", "").replace("-", "").isalnum() or not rest:
        msg = (
            f"REFOLD_SPARK__CHECKPOINT_URL={url} is not a path or a URL such as "
            "hdfs://namenode:8020/refold/checkpoints or s3a://bucket/refold/checkpoints"
        )
        raise ProcessorConfigError(msg)
    return url.rstrip("/")


def prefix_folder(key_prefix: str) -> str:
    """A key prefix as one folder name that every file system takes (HDFS refuses ``:``).

    Letters, digits, ``.``, ``_`` and ``-`` are kept; a prefix with anything else has it
    replaced by ``_`` and gets a hash of the prefix appended, so two prefixes never share one.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key_prefix)
    if safe == key_prefix and safe not in (".", ".."):
        return safe
    return f"{safe}-{hashlib.sha256(key_prefix.encode()).hexdigest()[:8]}"


def checkpoint_location(root: str, processor: str, generation: int, epoch: int = 0) -> str:
    """A generation's checkpoint: ``<root>/<processor>/g<N>``.

    ``g<N>-reset<E>`` after ``E`` in-place resets of the generation.
    """
    name = f"g{generation}" if epoch == 0 else f"g{generation}-reset{epoch}"
    return f"{root}/{processor}/{name}"


class CheckpointFiles(Protocol):
    """The file operations refold needs on checkpoints (paths are locations or URLs)."""

    def read_text(self, location: str) -> str:
        """The file's text. Raises OSError (FileNotFoundError when it is not there)."""
        ...

    def names(self, location: str) -> list[str]:
        """The entries of a directory ([] when it is not there)."""
        ...

    def remove(self, location: str) -> bool:
        """Remove a file or a directory tree; False when nothing was there."""
        ...


class _LocalFiles:
    @staticmethod
    def _path(location: str) -> Path:
        return Path(location.removeprefix("file://"))

    def read_text(self, location: str) -> str:
        return self._path(location).read_text()

    def names(self, location: str) -> list[str]:
        path = self._path(location)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def remove(self, location: str) -> bool:
        path = self._path(location)
        if path.is_dir():
            shutil.rmtree(path)
            return True
        if path.exists():
            path.unlink()
            return True
        return False


class _HadoopFiles:
    """Hadoop's ``FileSystem`` through py4j (any scheme the JVM's class path knows)."""

    def __init__(self, jvm: Any, conf: Any) -> None:
        self._jvm = jvm
        self._conf = conf

    def _fs(self, location: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        return path.getFileSystem(self._conf), path

    def read_text(self, location: str) -> str:
        from py4j.protocol import Py4JJavaError

        try:
            fs, path = self._fs(location)
            stream = fs.open(path)
            try:
                data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
        except Py4JJavaError as exc:
            raise _os_error(exc, location) from exc
        return bytes(data).decode()

    def names(self, location: str) -> list[str]:
        from py4j.protocol import Py4JJavaError

        try:
            fs, path = self._fs(location)
            if not fs.exists(path):
                return []
            return sorted(str(status.getPath().getName()) for status in fs.listStatus(path))
        except Py4JJavaError as exc:
            raise _os_error(exc, location) from exc

    def remove(self, location: str) -> bool:
        from py4j.protocol import Py4JJavaError

        try:
            fs, path = self._fs(location)
            return bool(fs.delete(path, True))
        except Py4JJavaError as exc:
            raise _os_error(exc, location) from exc


def _os_error(exc: Any, location: str) -> OSError:
    java = str(exc.java_exception)
    if "FileNotFoundException" in java:
        return FileNotFoundError(f"{location}: not found")
    return OSError(f"{location}: {java}")


_LOCAL = _LocalFiles()
_helper_lock = threading.Lock()
_helper: _HadoopFiles | None = None


def _helper_jvm_files(spark: SparkSettings | None) -> _HadoopFiles:
    """Hadoop's file systems in a JVM of this process's own (no Spark application needed)."""
    global _helper
    with _helper_lock:
        if _helper is None:
            import pyspark
            from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

            from refold.contracts.settings import SparkSettings
            from refold.processors.runtime.spark import connector_jars

            jars = Path(pyspark.__file__).parent / "jars"
            classpath = [f"{jars}/*", *(str(j) for j in connector_jars(spark or SparkSettings()))]
            if os.environ.get("HADOOP_CONF_DIR"):  # as spark-submit puts it on Spark's
                classpath.append(os.environ["HADOOP_CONF_DIR"])
            logger.info("starting a JVM for Hadoop's file systems (checkpoints)")
            port = launch_gateway(
                classpath=os.pathsep.join(classpath), die_on_exit=True, javaopts=["-Xmx256m"]
            )
            gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
            atexit.register(gateway.shutdown)
            _helper = _HadoopFiles(gateway.jvm, gateway.jvm.org.apache.hadoop.conf.Configuration())
        return _helper


def checkpoint_files(location: str, spark: SparkSettings | None = None) -> CheckpointFiles:
    """How to read and remove files at ``location`` (``spark``: jars for a helper JVM)."""
    if is_local(location):
        return _LOCAL
    from pyspark import SparkContext

    context = SparkContext._active_spark_context  # noqa: SLF001 - no public accessor
    if context is not None:
        return _HadoopFiles(context._jvm, context._jsc.hadoopConfiguration())  # noqa: SLF001
    return _helper_jvm_files(spark)


def has_batches(location: str) -> bool:
    """Whether Spark has planned a batch in this checkpoint (a query resumes from it)."""
    return bool(checkpoint_files(location).names(f"{location}/offsets"))


def remove_stale_checkpoint(location: str, spark: SparkSettings | None = None) -> None:
    """Remove what is at a new generation's checkpoint location before its first run.

    A generation number repeats when Redis lost the registry while the checkpoints survived;
    Spark resuming that checkpoint would skip records the generation never folded.
    """
    if checkpoint_files(location, spark).remove(location):
        logger.warning("removed stale checkpoint %s of a new generation", location)


def remove_generation_checkpoints(
    root: str, processor: str, generation: int, spark: SparkSettings | None = None
) -> int:
    """Remove every checkpoint of a generation (``g<N>`` and its resets); how many there were."""
    files = checkpoint_files(root, spark)
    folder = f"{root}/{processor}"
    ours = [
        name
        for name in files.names(folder)
        if name == f"g{generation}" or name.startswith(f"g{generation}-reset")
    ]
    for name in ours:
        files.remove(f"{folder}/{name}")
    return len(ours)
