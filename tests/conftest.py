"""Shared fixtures: markers by directory, the local stack (or an existing one), Spark, registry."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_MARK_BY_DIR = {"unit": "unit", "integration": "integration", "spark": "spark", "docker": "docker"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for directory, marker in _MARK_BY_DIR.items():
            if directory in parts:
                item.add_marker(getattr(pytest.mark, marker))


_STACK_ENV = ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")
_SHARED_STACK = pytest.StashKey[Any]()


def _session_stack(state_dir: Path) -> Any:
    """The run's one broker and Redis: a LocalStack on free ports, with the default topics."""
    from refold.deploy.local_stack import LocalStack, free_port

    stack = LocalStack(state_dir, free_port(), free_port(), redis_persistent=False).start()
    _create_default_topics(stack.bootstrap_servers)
    return stack


# The JVMs the tests start (Spark drivers, the broker, a Spark cluster, HDFS) run for seconds
# to minutes: C2's compilations cost them more CPU than they save, on 2 cores shared with the
# Python workers. C1 alone took a kill -9 test from 235 to 152 CPU-s (docs/testing.md).
# The `java` launcher reads it from its environment; set JDK_JAVA_OPTIONS to run otherwise.
_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def pytest_configure(config: pytest.Config) -> None:
    """The tests' JVMs compile with C1 alone; under ``-n N`` (pytest-xdist), the controller
    starts the run's one stack for its workers.

    The workers inherit its address through KAFKA_BOOTSTRAP_SERVERS and REDIS_URL, which
    :func:`local_stack` honours: one broker per run, however many workers share it. Tests
    already share it one after the other; each uses its own topics and key prefix.
    """
    os.environ.setdefault("JDK_JAVA_OPTIONS", _TEST_JVM_OPTIONS)
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not workers or all(map(os.environ.get, _STACK_ENV)):
        return
    stack = _session_stack(Path(tempfile.mkdtemp(prefix="refold-tests-stack-")))
    config.stash[_SHARED_STACK] = stack
    os.environ.update(KAFKA_BOOTSTRAP_SERVERS=stack.bootstrap_servers, REDIS_URL=stack.redis_url)


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_SHARED_STACK, None)
    if stack is not None:
        for name in _STACK_ENV:
            os.environ.pop(name, None)
        stack.stop()
        shutil.rmtree(stack.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, redis url): an existing stack from the environment, else a local one.

    Set KAFKA_BOOTSTRAP_SERVERS and REDIS_URL to run the suite against servers you started
    (``-n N`` does so for its workers: :func:`pytest_configure`).
    """
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    redis_url = os.environ.get("REDIS_URL")
    if bootstrap and redis_url:
        yield bootstrap, redis_url
        return
    stack = _session_stack(tmp_path_factory.mktemp("stack"))
    try:
        yield stack.bootstrap_servers, stack.redis_url
    finally:
        stack.stop()


_MADE_UP_SOURCES = ("orders", "changes", "crm", "durable", "pv", "se", "clicks")
_MADE_UP_PARTITIONS = 16


def _create_default_topics(bootstrap: str) -> None:
    """The topics the installed processors read and write under their default names.

    Kafka creates no topic on first use (refold's broker runs with auto-creation off), and
    tests that drive a writer directly skip the runner, which creates a processor's topics at
    start: so the session creates them as `refold topics` and each processor's start would.
    """
    import importlib

    from refold.contracts.kafka.admin import ensure_topics
    from refold.contracts.processors import ProcessorOptions
    from refold.contracts.registry import default_registry
    from refold.contracts.topics import TopicSpec, dead_letter_spec, effects_spec
    from refold.contracts.windows import windows_topic

    def load(ref: str) -> Any:
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)

    registry = default_registry()
    declared = [t for contract_set in registry.contract_sets.values() for t in contract_set.topics]
    outputs = []
    for name, spec in sorted(registry.processors.items()):
        options = load(spec.options)() if spec.options else ProcessorOptions()
        projection = load(spec.projection)(options)
        outputs += [windows_topic(name), f"{name}.late", *getattr(projection, "effect_topics", ())]
    known = {t.name for t in declared}
    config = {"bootstrap.servers": bootstrap}
    ensure_topics(config, [*declared, *(dead_letter_spec(n) for n in sorted(registry.processors))])
    ensure_topics(config, [effects_spec(t) for t in dict.fromkeys(outputs) if t not in known])
    # The source topics of the tests that feed a writer records they make up: a writer commits
    # its outputs with an offset per source partition, and Kafka keeps offsets only for
    # partitions that exist (refold.processors.runtime.output_transactions).
    ensure_topics(
        config,
        [
            TopicSpec(name, _MADE_UP_PARTITIONS, "(test)", ("(any)",))
            for name in _MADE_UP_SOURCES
            if name not in known
        ],
    )


@pytest.fixture(scope="session")
def kafka_bootstrap(local_stack: tuple[str, str]) -> str:
    return local_stack[0]


@pytest.fixture(scope="session")
def redis_url(local_stack: tuple[str, str]) -> str:
    return local_stack[1]


@pytest.fixture
def unique() -> str:
    """A short unique token for topic names and key prefixes of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def make_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Create uniquely named topics for one test and delete them afterwards."""
    from confluent_kafka.admin import AdminClient

    created: list[str] = []

    def _make(partitions: int = 4, prefix: str = "t") -> str:
        from refold.contracts.kafka.admin import ensure_topics
        from refold.contracts.topics import TopicSpec

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        # Through ensure_topics: it returns once the broker serves the topic's leaders.
        spec = TopicSpec(name, partitions, "(test)", ("(any)",))
        ensure_topics({"bootstrap.servers": kafka_bootstrap}, [spec])
        created.append(name)
        return name

    yield _make
    if created:
        # A client made now: one made before the test kept the metadata it read then, and
        # after a test that killed a node it sent the deletion to that node and waited 30 s
        # a topic (librdkafka's admin requests wait for the node they chose).
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.delete_topics(created).values():
            # Cleanup must not mask the test's outcome.
            with contextlib.suppress(Exception):
                future.result(timeout=30)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] SparkSession for the whole run (start-up costs ~6 s)."""
    from refold.processors.runtime.spark import build_spark_session

    session = build_spark_session("refold-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real schema registry for the session: Apicurio, started once per test process.

    Started as ``refold up --schema-registry`` starts it (:class:`LocalSchemaRegistry`, in a
    ``stack`` folder of its own; ~7 CPU-s, ~250 MB); its Confluent-compatible API is ``.url``.
    Without Java 21+ or the app (``make setup``) it fails, naming what is missing: never
    skipped. Tests register what they need under subjects of their own.
    """
    from refold.deploy.local_stack import free_port
    from refold.deploy.schema_registry import LocalSchemaRegistry

    root = tmp_path_factory.mktemp("registry-state")
    registry = LocalSchemaRegistry(root / "stack", free_port()).start()
    try:
        yield registry
    finally:
        registry.stop()
