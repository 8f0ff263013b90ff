"""Kafka Connect in standalone mode, for tests: a client no one here wrote.

The worker (``org.apache.kafka.connect.cli.ConnectStandalone``), Kafka's FileStreamSink and
Apicurio's Avro converter, all from the jars ``make setup`` copies into ``.jars/kafka-connect``
(module ``deploy/jars/kafka-connect``), run on the Java that runs the broker. The worker is a
child process of the test, stopped by its PID.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from refold.contracts.process_group import start_daemon, terminate
from refold.deploy.kafka_broker import java_binary

JARS = Path(__file__).resolve().parents[2] / ".jars" / "kafka-connect"
_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


def registry_converter(registry_v2_url: str) -> dict[str, str]:
    """Apicurio's AvroConverter reading the Confluent wire format: ``00`` + a 4-byte id.

    - ``apicurio.registry.as-confluent``: the id is 4 bytes (``Legacy4ByteIdHandler``), not
      Apicurio's default 8-byte global id;
    - ``apicurio.registry.use-id=contentId``: that id is a content id, what the registry's
      Confluent-compatible API hands out as a schema id (and refold writes);
    - ``apicurio.registry.headers.enabled=false``: the id is in the value, not in headers.
    """
    return {
        "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
        "value.converter.apicurio.registry.url": registry_v2_url,
        "value.converter.apicurio.registry.as-confluent": "true",
        "value.converter.apicurio.registry.use-id": "contentId",
        "value.converter.apicurio.registry.headers.enabled": "false",
    }


def _properties(values: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


@dataclass
class StandaloneConnect:
    """One standalone worker running one connector, its files under ``folder``."""

    folder: Path
    bootstrap: str
    connector: Mapping[str, str]
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log_file(self) -> Path:
        return self.folder / "connect.log"

    def start(self) -> StandaloneConnect:
        if not any(JARS.glob("connect-runtime-*.jar")):
            msg = f"Kafka Connect's jars are not in {JARS}: run `make setup`"
            raise RuntimeError(msg)
        self.folder.mkdir(parents=True, exist_ok=True)
        worker = self.folder / "worker.properties"
        worker.write_text(
            _properties(
                {
                    "bootstrap.servers": self.bootstrap,
                    "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                    "value.converter": "org.apache.kafka.connect.storage.StringConverter",
                    "offset.storage.file.filename": str(self.folder / "offsets"),
                    "offset.flush.interval.ms": "1000",
                    "listeners": "http://127.0.0.1:0",
                    "plugin.discovery": "only_scan",
                }
            )
        )
        connector = self.folder / "connector.properties"
        connector.write_text(_properties(self.connector))
        logging = self.folder / "log4j2.properties"
        logging.write_text(
            "rootLogger.level=INFO\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=%d %p %c{1} %m%n\n"
        )
        command = [
            java_binary(),
            "-Xms64m",
            "-Xmx256m",
            "-Duser.timezone=UTC",
            f"-Dlog4j2.configurationFile={logging}",
            "-cp",
            f"{JARS}/*",
            _MAIN,
            str(worker),
            str(connector),
        ]
        self.process = start_daemon(command, self.log_file)
        return self

    def wait_for_lines(self, path: Path, count: int, timeout_s: float = 180.0) -> list[str]:
        """The sink file's lines once it holds ``count`` (or fail with the worker's log)."""
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        while time.monotonic() < deadline:
            if path.is_file():
                lines = path.read_text().splitlines()
                if len(lines) >= count:
                    return lines
            if self.process is None or self.process.poll() is not None:  # the worker stopped
                break
            time.sleep(0.5)
        tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-30:])
        msg = f"the sink wrote {len(lines)} of {count} lines; the worker's log ends with:\n{tail}"
        raise AssertionError(msg)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process.pid, 20.0)
            self.process = None
