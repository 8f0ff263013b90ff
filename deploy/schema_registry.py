"""The local schema registry: Apicurio Registry, a child process of ``refold up --schema-registry``.

Apicurio Registry 3.x (``io.apicurio:apicurio-registry-app``, the ``all`` tar.gz that
``make setup`` copies into ``.jars/schema-registry``; unpacked there on first start) is a
Quarkus application run with ``java -jar quarkus-run.jar``. refold talks to it only through
its Confluent-compatible API, ``/apis/ccompat/v7`` (confluent-kafka's ``SchemaRegistryClient``),
so any Confluent-compatible registry (Confluent's, Karapace) serves in production.

Storage is a file: Apicurio's own SQL storage on H2 (the driver its app ships), pointed at a
database file under the state dir (``schema-registry/registry.mv.db``) instead of its default
in-memory H2 database. Its schemas and their ids survive ``refold down`` / ``refold up``, as the
broker's log does, so a record written in registry framing is still read after a restart.

3.x needs Java 21 or later (class file 65). :func:`registry_java` finds one: the setting
``REFOLD_SCHEMA_REGISTRY_JAVA_HOME``, else ``JAVA_HOME``, else the ``java`` on the PATH, else
the newest JDK under ``/usr/lib/jvm``; each only if it is 21 or later.

Lifecycle contract as the rest of the local stack: one pid file (``schema-registry.pid``,
"PID PORT") and one log file under the stack's state dir; :meth:`LocalSchemaRegistry.stop`
ends the recorded PID only (after checking it still runs ``quarkus-run.jar``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from refold.contracts.process_group import alive, start_daemon, terminate
from refold.deploy.local_stack import free_port

__all__ = [
    "CCOMPAT_PATH",
    "DEFAULT_REGISTRY_PORT",
    "JAVA_HOME_ENV",
    "MIN_JAVA",
    "LocalSchemaRegistry",
    "RegistryStatus",
    "SchemaRegistryError",
    "app_dir",
    "java_version",
    "registry_java",
]

DEFAULT_REGISTRY_PORT = 18081  # beside 19092 (Kafka) and 16379 (Redis)
CCOMPAT_PATH = "/apis/ccompat/v7"
JAVA_HOME_ENV = "REFOLD_SCHEMA_REGISTRY_JAVA_HOME"
JARS_ENV = "REFOLD_SCHEMA_REGISTRY_JARS"
MIN_JAVA = 21
_PROGRAM = "quarkus-run.jar"
_JVM_ROOT = Path("/usr/lib/jvm")
# Measured here: ready 4-6 s after start (Temurin 25, 2 cores); allow for a loaded machine.
_READY_TIMEOUT_S = 120.0
_STOP_GRACE_S = 20.0
_VERSION = re.compile(r'^JAVA_VERSION="(?P<major>\d+)', re.MULTILINE)


class SchemaRegistryError(RuntimeError):
    """The local schema registry could not be found, started or stopped."""


def java_version(home: Path) -> int | None:
    """The major version of the JDK or JRE at ``home`` (from its ``release`` file), if any."""
    try:
        match = _VERSION.search((home / "release").read_text())
    except OSError:
        return None
    return int(match["major"]) if match else None


def _home_of(java: str) -> Path:
    return Path(os.path.realpath(java)).parent.parent


def registry_java(environ: dict[str, str] | None = None, jvm_root: Path = _JVM_ROOT) -> str:
    """The ``java`` (21 or later) that runs the registry.

    Raises:
        SchemaRegistryError: None is 21 or later, naming what was found and what to do.
    """
    env = os.environ if environ is None else environ
    candidates: list[tuple[str, Path]] = []
    for name in (JAVA_HOME_ENV, "JAVA_HOME"):
        if env.get(name):
            candidates.append((name, Path(env[name])))
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        candidates.append(("java on the PATH", _home_of(on_path)))
    installed = [p for p in jvm_root.glob("*") if p.is_dir() and not p.is_symlink()]
    installed.sort(key=lambda p: java_version(p) or 0, reverse=True)
    candidates += [(str(jvm_root), home) for home in installed]
    seen: list[str] = []
    for origin, home in candidates:
        version = java_version(home)
        java = home / "bin" / "java"
        if version is not None and version >= MIN_JAVA and java.is_file():
            return str(java)
        seen.append(f"{home} ({origin}): Java {version or 'unknown'}")
    if env.get(JAVA_HOME_ENV):
        msg = f"{JAVA_HOME_ENV}={env[JAVA_HOME_ENV]} is not a Java {MIN_JAVA}+ home"
    else:
        msg = "no Java 21 or later found"
    msg += (
        f": Apicurio Registry 3.x needs Java {MIN_JAVA} or later (class file 65); found "
        f"{'; '.join(seen) or 'no java at all'}. Operator action: install one (e.g. "
        f"`apt-get install -y openjdk-21-jre-headless`) and set {JAVA_HOME_ENV} to its home."
    )
    raise SchemaRegistryError(msg)


def app_dir(jars: Path | None = None) -> Path:
    """Apicurio Registry's unpacked application (unpacked from its tar.gz on first use).

    Args:
        jars: The folder ``make setup`` copies the tar.gz into: ``REFOLD_SCHEMA_REGISTRY_JARS``,
            else ``.jars/schema-registry`` of the checkout.

    Raises:
        SchemaRegistryError: No tar.gz there (with what to run).
    """
    configured = os.environ.get(JARS_ENV)
    default = Path(__file__).resolve().parents[1] / ".jars" / "schema-registry"
    folder = jars or (Path(configured) if configured else default)
    archives = sorted(folder.glob("apicurio-registry-app-*-all.tar.gz"))
    if not archives:
        msg = (
            f"Apicurio Registry is not in {folder}. Operator action: run `make setup` (it "
            "fetches io.apicurio:apicurio-registry-app:tar.gz:all with mvn from "
            f"deploy/jars/schema-registry/pom.xml), or set {JARS_ENV} to a folder that holds it."
        )
        raise SchemaRegistryError(msg)
    archive = archives[-1]
    target = folder / archive.name.removesuffix("-all.tar.gz")
    done = target / ".unpacked"
    if not done.is_file():
        staging = folder / f".{target.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        (staging / ".unpacked").write_text(archive.name + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


@dataclass(frozen=True, slots=True)
class RegistryStatus:
    """What ``refold status`` reports of the registry."""

    port: int
    pid: int | None
    running: bool
    log_file: Path

    @property
    def url(self) -> str:
        """Its Confluent-compatible API: ``REFOLD_SCHEMA_REGISTRY__URL``."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"


class LocalSchemaRegistry:
    """Apicurio Registry on a loopback port, with a pid and a log file in ``state_dir``.

    Args:
        state_dir: The local stack's state dir.
        port: Its HTTP port (``refold up --schema-registry-port``, default 18081).
    """

    def __init__(self, state_dir: Path, port: int = DEFAULT_REGISTRY_PORT) -> None:
        self.state_dir = Path(state_dir)
        self.port = port
        self.pid_file = self.state_dir / "schema-registry.pid"
        self.log_file = self.state_dir / "schema-registry.log"
        self.data_dir = self.state_dir / "schema-registry"
        self._marker = self.state_dir / "schema-registry.enabled"

    @property
    def url(self) -> str:
        """The Confluent-compatible API of the recorded (else this) port."""
        return self.status().url

    @property
    def database_url(self) -> str:
        """The JDBC URL of its storage: an H2 database file in :attr:`data_dir`."""
        return f"jdbc:h2:file:{self.data_dir / 'registry'}"

    @property
    def configured(self) -> bool:
        """Whether this state dir runs a registry: once started here, ``refold up`` starts it."""
        return self._marker.is_file()

    def _recorded(self) -> tuple[int | None, int]:
        """The pid file's ``(pid, port)``; else no pid, and the port it was last started on."""
        try:
            words = self.pid_file.read_text().split()
            return int(words[0]), int(words[1])
        except (OSError, ValueError, IndexError):
            pass
        try:
            return None, int(self._marker.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None, self.port

    def status(self) -> RegistryStatus:
        """The recorded pid and port, and whether that process still runs the registry."""
        pid, port = self._recorded()
        return RegistryStatus(port, pid, pid is not None and _runs_registry(pid), self.log_file)

    def start(self, java: str | None = None) -> LocalSchemaRegistry:
        """Start it (unless it runs) and wait until its Confluent-compatible API answers.

        Raises:
            SchemaRegistryError: No Java 21+, no application, the port is taken, or it did not
                answer in time (its log's tail in the message; the process is stopped).
        """
        if self.status().running:
            return self
        java = java or registry_java()
        app = app_dir()
        management_port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            java,
            "-Xms64m",
            "-Xmx384m",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            "-Dquarkus.log.console.json=false",
            # Quarkus' management interface (health, metrics; on in Apicurio's build) listens
            # on 0.0.0.0:9000 by default: a second registry on the machine (another state dir,
            # a parallel test worker) failed to bind it. refold reads only the ccompat API.
            f"-Dquarkus.management.port={management_port}",
            "-Dquarkus.management.host=127.0.0.1",
            # SQL storage (its default kind) on an H2 file, not its in-memory default
            f"-Dapicurio.datasource.url={self.database_url}",
            "-jar",
            str(app / _PROGRAM),
        ]
        proc = start_daemon(command, self.log_file, cwd=app)
        self.pid_file.write_text(f"{proc.pid} {self.port}\n")
        self._marker.write_text(f"{self.port}\n")
        try:
            self._wait_ready(proc.pid)
        except BaseException:
            terminate(proc.pid, _STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()
            raise
        return self

    def _failed_to_start(self) -> bool:
        """Quarkus logged that the application failed (a port taken): it may not exit itself."""
        try:
            return "Failed to start application" in self.log_file.read_text(errors="replace")
        except OSError:
            return False

    def _wait_ready(self, pid: int) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        url = f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}/subjects"
        while time.monotonic() < deadline and alive(pid) and not self._failed_to_start():
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        try:
            tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = "(no log)"
        msg = f"the schema registry did not answer on port {self.port}; its log ends with:\n{tail}"
        raise SchemaRegistryError(msg)

    def stop(self) -> None:
        """Stop the recorded process (idempotent; a missing one is not an error)."""
        pid, _ = self._recorded()
        if pid is not None and _runs_registry(pid):
            terminate(pid, _STOP_GRACE_S)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()


def _runs_registry(pid: int) -> bool:
    """``pid`` is alive and runs the registry (guards against a reused pid)."""
    if not alive(pid):
        return False
    try:
        return _PROGRAM in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return True
