"""Fixtures of the docker layer: pytest-docker over deploy/compose.yaml (Apache Kafka + Redis).

pytest-docker registers its fixtures (``docker_services``, ``docker_ip``, ...) for every test run,
but a fixture only runs where a test asks for it, and only the tests in this directory do; the
overrides below apply to this directory alone. So the unit, integration and spark layers neither
start containers nor need an engine.

Without a Docker engine (or without the compose plugin) every test here is skipped, and the
reason says which one is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_docker import Services

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml"
# A cold start pulls apache/kafka and redis images first; KRaft then needs ~10-20 s.
_READY_TIMEOUT_S = 180.0
_READY_PAUSE_S = 1.0


def _run_docker(*args: str) -> tuple[bool, str]:
    """Run ``docker <args>``; (succeeded, the last line of its error output)."""
    try:
        done = subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else f"exit status {done.returncode}"


def _why_no_docker() -> str | None:
    """None when a Docker engine and ``docker compose`` answer, else the reason."""
    if shutil.which("docker") is None:
        return "no Docker engine: the docker client is not installed"
    answered, detail = _run_docker("info", "--format", "{{.ServerVersion}}")
    if not answered:
        return f"no Docker engine answers (`docker info`: {detail})"
    answered, detail = _run_docker("compose", "version")
    if not answered:
        return f"the Docker Compose plugin is missing (`docker compose version`: {detail})"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Skip the requesting test unless a Docker engine and ``docker compose`` answer."""
    reason = _why_no_docker()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    """The stack under test: deploy/compose.yaml (pytest-docker's default is tests/)."""
    return str(COMPOSE)


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    """A project of this run's own, so `down -v` removes only what the run created."""
    return f"refold-tests-{os.getpid()}"


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    """Start only the servers (the processor image sits behind the `processors` profile)."""
    return ["up --wait kafka redis"]


@pytest.fixture(scope="session")
def docker_services(docker_engine: None, docker_services: Services) -> Services:
    """pytest-docker's ``docker_services``, asked for only once an engine answers.

    ``docker_engine`` comes first among the arguments, so its skip happens before
    pytest-docker runs ``docker compose up`` (which would fail with an error, not a skip).
    """
    return docker_services


@pytest.fixture(scope="session")
def compose_stack(docker_services: Services, docker_ip: str) -> tuple[str, str]:
    """(bootstrap servers, redis url) of the compose stack, once both answer from the host.

    The compose file advertises Kafka as ``localhost:9092``, so this works where
    ``docker_ip`` is the loopback address (a local engine; not a remote DOCKER_HOST).
    """
    bootstrap = f"{docker_ip}:{docker_services.port_for('kafka', 9092)}"
    redis_url = f"redis://{docker_ip}:{docker_services.port_for('redis', 6379)}/0"
    docker_services.wait_until_responsive(
        check=lambda: _kafka_answers(bootstrap), timeout=_READY_TIMEOUT_S, pause=_READY_PAUSE_S
    )
    docker_services.wait_until_responsive(
        check=lambda: _redis_answers(redis_url), timeout=_READY_TIMEOUT_S, pause=_READY_PAUSE_S
    )
    return bootstrap, redis_url


def _kafka_answers(bootstrap: str) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5)
    except KafkaException:
        return False
    return True


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except redis.RedisError:
        return False
