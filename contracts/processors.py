"""What the platform knows about a processor without importing it, and how one is started.

A processor is declared by a :class:`ProcessorSpec` that its package registers under the entry
point group ``refold.processors`` (:mod:`refold.contracts.registry` finds them). The CLI, replay,
the demo, the benchmark and the tests know processors only through these specs, and start them
only through the process contract below (:func:`process_argv`, :func:`process_env`):
``python -m refold.processors NAME [NAME ...] --generation G --starting-offsets J`` (and
``--ending-offsets J`` for a state as of a moment) with every setting in ``REFOLD_*`` variables.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr

from refold.contracts.errors import ContractError
from refold.contracts.fingerprints import DeclaredCode
from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.settings import (
    KafkaSettings,
    RedisSettings,
    SchemaRegistrySettings,
    SparkSettings,
)

# How a processor reads Kafka: refold's Python source planning offset ranges (each task reads
# its own range), the same source yielding records through Spark, or Spark's own JVM connector.
SourceFormat = Literal["refold_kafka_ranges", "refold_kafka", "kafka"]

__all__ = [
    "LATE_POLICIES",
    "PROCESSOR_MODULE",
    "STOP_WITH_PARENT_ENV",
    "EventId",
    "EventTime",
    "KeyLink",
    "ProcessLauncher",
    "ProcessorOptions",
    "ProcessorSpec",
    "SourceFormat",
    "StateTtl",
    "consumer_group",
    "options_env_prefix",
    "options_environ",
    "process_argv",
    "settings_env",
]

# The one processor command: ``python -m refold.processors NAME ...`` (processors/__main__.py).
PROCESSOR_MODULE = "refold.processors"
# Environment variable of the process contract: the pid of the process that started this
# processor and whose end must stop it (replay sets it for the processor building a generation,
# so that a kill -9 of the replay orphans nothing).
STOP_WITH_PARENT_ENV = "REFOLD_STOP_WITH_PARENT"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def consumer_group(processor: str, generation: int, key_prefix: str) -> str:
    """The Kafka consumer group that mirrors a generation's progress (for lag tooling).

    ``refold.<processor>.g<N>`` under the default key prefix and
    ``refold.<key prefix>.<processor>.g<N>`` under any other: two deployments that share a
    Kafka cluster (staging and production, or two test sessions) keep their own groups, so
    neither one's commits show up as the other's lag, and an in-place reset of one is never
    refused for the other's members.
    """
    if key_prefix == DEFAULT_KEY_PREFIX:
        return f"refold.{processor}.g{generation}"
    return f"refold.{key_prefix}.{processor}.g{generation}"


def options_env_prefix(processor: str) -> str:
    """``REFOLD_<PROCESSOR>__``: the environment prefix of one processor's options."""
    return f"REFOLD_{processor.upper()}__"


@dataclass(frozen=True, slots=True)
class KeyLink:
    """How an event that lacks the entity key finds it: through another field's first link.

    Example: ``KeyLink(via="order_id", key="customer_id")``: an ``OrderPaid`` (order_id only)
    belongs to the customer of the first earlier event of that order that carried both fields
    (its ``OrderPlaced``). ``via`` must be the partition key of the topic, so that the linking
    event and the linked ones are on one partition, in log order; a link never changes once
    made, so live processing and every replay resolve each event alike.
    """

    via: str
    key: str


LATE_POLICIES = ("dead-letter", "side-output", "accept")
_WEEK_MS = 7 * 24 * 3_600_000


@dataclass(frozen=True, slots=True)
class EventTime:
    """How a processor reads time: its event-time field, allowed lateness and late policy.

    Lateness is decided per source partition, in log order (DESIGN.md decision 11): a
    partition's watermark is the largest event time seen on it minus ``lateness_ms``, and a
    record below its partition's watermark is late, whatever the micro-batch boundaries. So
    live processing and every replay decide alike.

    Attributes:
        field: The event field holding the event time (Avro ``timestamp-millis`` or epoch
            milliseconds). Every event type the processor folds must have it.
        lateness_ms: How far behind its partition's newest event time a record may be.
        late: What happens to a late record: ``dead-letter`` (reason ``late``),
            ``side-output`` (the record goes unchanged to ``late_topic``) or ``accept`` (it is
            folded, and a window it lands in that had closed emits its corrected result).
        retention_ms: How long after its end a window's buckets are kept (on the processor's
            watermark, not the wall clock). Under ``accept``, a record older than its
            partition's watermark minus this is dead-lettered (reason ``expired``): its buckets
            may be gone.
        late_topic: The side-output topic; default ``<processor>.late``.
        by_type: ``(event type, field)`` pairs for the event types whose time is in another
            field (``CustomerRegistered`` -> ``registered_at``).
        idle_ms: On a topic that carries watermark markers (another processor's output
            stream: docs/event-time.md, "Across chains"), an upstream stream whose clock is
            more than this behind the partition's newest stream clock is idle and does not
            hold the partition's watermark back. Event time on one partition's log, never the
            wall clock, so a replay decides alike. ``None``: never idle.
    """

    field: str
    lateness_ms: int = 0
    late: str = "dead-letter"
    retention_ms: int = _WEEK_MS
    late_topic: str = ""
    by_type: tuple[tuple[str, str], ...] = ()
    idle_ms: int | None = None

    def field_of(self, event_type: str) -> str:
        """The field holding the event time of ``event_type``."""
        for name, field_name in self.by_type:
            if name == event_type:
                return field_name
        return self.field

    def __post_init__(self) -> None:
        problems = []
        if not self.field:
            problems.append("event_time.field is empty")
        if self.lateness_ms < 0 or self.retention_ms < 0:
            problems.append("lateness_ms and retention_ms must be >= 0")
        if self.idle_ms is not None and self.idle_ms < 0:
            problems.append("idle_ms must be >= 0 or None")
        if self.late not in LATE_POLICIES:
            problems.append(f"late must be one of {', '.join(LATE_POLICIES)}, not {self.late!r}")
        if problems:
            raise ContractError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class EventId:
    """De-duplication by event id: an entity applies an event at most once within a horizon.

    A producer that retries from a new process, or a range of the log copied twice, puts the
    same event in the log twice. With ``dedupe=EventId()`` an entity fold remembers the ids of
    the last ``horizon`` events each entity applied (in the generation's state, written in the
    transaction with the entity), and passes a record whose id it remembers by, counted as a
    duplicate. The oracle (:func:`~refold.processors.fold.oracle.fold_all` with ``dedupe=``)
    applies the same rule, so live == oracle == replay with duplicated events in the log.

    Attributes:
        field: The event field holding the event's id; an event without it is not checked.
        horizon: How many of each entity's latest event ids are remembered. Memory is about
            ``horizon`` ids per entity (40-50 bytes each as JSON); a duplicate that arrives
            after ``horizon`` newer events of its entity is applied again.
    """

    field: str = "event_id"
    horizon: int = 1000

    def __post_init__(self) -> None:
        if not self.field or self.horizon < 1:
            msg = f"dedupe needs a field and a horizon >= 1 (got {self.field!r}, {self.horizon})"
            raise ContractError(msg)


@dataclass(frozen=True, slots=True)
class StateTtl:
    """State that expires: an entity with no event for ``after_ms`` of event time is removed.

    Decided on event time, never the wall clock (DESIGN.md decision 21), through the timers the
    fold already has: each entity's expiry is the largest event time it applied plus
    ``after_ms``. It is removed once its timer group's watermark (the one its timers fire on:
    its partition's, or re-keyed its writer slot's) reaches the expiry, or at its next event if
    that event's time is at or past the expiry, whichever comes first. Its state leaves the
    table and its contribution leaves the aggregate, as a deleted entity's does; the removal is
    counted in the stats (``expired``). The oracle
    (:func:`~refold.processors.fold.oracle.fold_timed` with ``state_ttl=``) applies the same
    rule, so live == replay == oracle with entities expiring.

    Attributes:
        after_ms: How long (event time, ms) an entity may go without an event. Needs the
            processor's ``event_time``; entity folds only.
    """

    after_ms: int

    def __post_init__(self) -> None:
        if isinstance(self.after_ms, bool) or not isinstance(self.after_ms, int):
            msg = f"state_ttl needs after_ms as an int of milliseconds, not {self.after_ms!r}"
            raise ContractError(msg)
        if self.after_ms < 1:
            msg = f"state_ttl needs after_ms >= 1, not {self.after_ms}"
            raise ContractError(msg)


class ProcessorOptions(BaseModel):
    """Runtime options every processor has (``REFOLD_<PROCESSOR>__<OPTION>``).

    A processor with options of its own declares a subclass (``ProcessorSpec.options``).

    Attributes:
        topics: Topic names to read instead of the spec's (same count and order): tests and
            staging run on their own topics.
        dead_letter_topic: Default ``<processor>.dlq``.
        windows_topic: Where a window processor's closed windows go; default
            ``<processor>.windows``.
        max_offsets_per_trigger: Records per micro-batch. 200k: big enough to amortise Spark's
            0.3-0.9 s fixed cost per batch during catch-up, small enough to bound memory.
        max_tasks: Spark tasks per micro-batch; two measured fastest on 2 cores (raise on a
            cluster). For a re-keyed processor: the number of writer slots of a generation.
        trigger_interval: Processing-time trigger; keeps the idle offset probes cheap.
        source_format: ``refold_kafka_ranges`` (each task reads its own records in the worker
            that folds them), ``refold_kafka`` (records through Spark) or ``kafka`` (Spark's
            JVM connector, from ``make setup``'s jars). docs/local-broker.md, "Two Kafka sources".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topics: list[str] | None = None
    dead_letter_topic: str | None = None
    windows_topic: str | None = None
    max_offsets_per_trigger: int = 200_000
    max_tasks: int = 2
    trigger_interval: str = "250 milliseconds"
    source_format: SourceFormat = "refold_kafka_ranges"


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """A processor as the platform sees it.

    Attributes:
        name: Processor name (Redis keys, consumer group, dead-letter topic, settings prefix):
            lower case, digits and ``_``.
        projection: ``module:attribute`` of a callable taking the processor's options and
            returning its :class:`~refold.processors.fold.projection.Projection` (or window fold),
            or a :class:`~refold.processors.fold.dataframe.DataFrameProcessor` (an object with
            ``transform``: a Spark DataFrame transformation). Imported only by the processor's
            own process.
        topics: Topics it folds.
        key: The event field that identifies its entity. When it is not the partition key of
            every topic, the processor is re-keyed: each entity still has one writer. A
            DataFrame processor is never re-keyed (its rows' keys come from its transform):
            give its topics' partition key.
        tables: Entity tables it writes.
        aggregates: Aggregate hashes it writes.
        key_links: How events without ``key`` find it (see :class:`KeyLink`).
        event_time: Its event time, lateness and late policy (see :class:`EventTime`); needed
            by windows and timers.
        dedupe: De-duplication by event id (see :class:`EventId`); entity folds only.
        state_ttl: State that expires on event time (see :class:`StateTtl`); entity folds
            with an ``event_time`` only.
        windows: Names of the windows it writes (``refold processors``, the readers).
        options: ``module:Class`` of its options (a :class:`ProcessorOptions` subclass), or
            empty for the common ones.
        description: One line for ``refold processors``.
        code_version: An explicit version of the fold, part of its code identity: bump it when
            something a hash of the package's modules cannot see changes the state (a data
            file, a model). "" declares none.
        depends_on: Distributions whose installed versions are part of its code identity
            (a library the fold calls into, outside its own package); ``"refold"`` makes
            refold's own upgrades count too.
        package: The distribution that registered it (filled in by the registry).
    """

    name: str
    projection: str
    topics: tuple[str, ...]
    key: str
    tables: tuple[str, ...]
    aggregates: tuple[str, ...] = ()
    key_links: tuple[KeyLink, ...] = ()
    event_time: EventTime | None = None
    windows: tuple[str, ...] = ()
    options: str = ""
    dedupe: EventId | None = None
    state_ttl: StateTtl | None = None
    description: str = ""
    code_version: str = ""
    depends_on: tuple[str, ...] = ()
    package: str = ""

    @property
    def declared_code(self) -> DeclaredCode:
        """What it declares about its code (part of the code fingerprint)."""
        factory_module = self.projection.partition(":")[0]
        return DeclaredCode(self.code_version, self.depends_on, factory_module)

    def __post_init__(self) -> None:
        problems = []
        if not _NAME.match(self.name):
            problems.append("the name must be lower case letters, digits and _")
        if ":" not in self.projection:
            problems.append("projection must be 'module:attribute'")
        if not self.topics:
            problems.append("no topics")
        if self.options and ":" not in self.options:
            problems.append("options must be 'module:Class'")
        if self.state_ttl is not None and self.event_time is None:
            problems.append("state_ttl is decided on event time: declare event_time too")
        if problems:
            msg = f"processor {self.name!r}: {'; '.join(problems)}"
            raise ContractError(msg)


def process_argv(
    names: Sequence[str],
    *,
    generation: str | int | None = None,
    starting_offsets: str | None = None,
    available_now: bool = False,
    ending_offsets: str | None = None,
    accept_code_change: bool = False,
    print_fingerprint: bool = False,
    python: str = sys.executable,
) -> list[str]:
    """The command line that runs processors ``names`` in one Spark application.

    ``ending_offsets`` (Spark's offsets JSON) bounds the run: it folds up to, excluding, those
    offsets and exits (``replay --until``: a state as of a moment).
    """
    argv = [python, "-m", PROCESSOR_MODULE, *names]
    if generation is not None:  # the command's default: live
        argv += ["--generation", str(generation)]
    if starting_offsets is not None:
        argv += ["--starting-offsets", starting_offsets]
    if available_now:
        argv.append("--available-now")
    if ending_offsets is not None:
        argv += ["--ending-offsets", ending_offsets]
    if accept_code_change:
        argv.append("--accept-code-change")
    if print_fingerprint:
        argv.append("--print-fingerprint")
    return argv


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, SecretStr):
        out[prefix] = value.get_secret_value()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _flatten(f"{prefix}__{name.upper()}", getattr(value, name), out)
    elif value is None:
        return
    elif isinstance(value, Mapping | list | tuple):
        plain = {
            k: v.get_secret_value() if isinstance(v, SecretStr) else v
            for k, v in (value.items() if isinstance(value, Mapping) else enumerate(value))
        }
        out[prefix] = json.dumps(plain if isinstance(value, Mapping) else list(plain.values()))
    else:
        out[prefix] = str(value)


def settings_env(prefix: str, block: BaseModel) -> dict[str, str]:
    """A settings block as the environment variables that recreate it (``PREFIX__FIELD``)."""
    out: dict[str, str] = {}
    for name in type(block).model_fields:
        _flatten(f"{prefix}__{name.upper()}", getattr(block, name), out)
    return out


def options_environ(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per processor, its ``REFOLD_<PROCESSOR>__*`` variables in ``environ`` (for a launcher)."""
    return {
        name: {k: v for k, v in environ.items() if k.upper().startswith(options_env_prefix(name))}
        for name in names
    }


@dataclass(frozen=True, slots=True)
class ProcessLauncher:
    """The process contract: the command line and the complete environment of a processor.

    Replay, the demo, the benchmark and the tests start processors only through this, so every
    setting reaches the child explicitly (nothing is left to what the parent happens to have in
    its environment, except ``PATH``-like basics, which the caller adds).

    Attributes:
        kafka: Broker settings.
        redis: Redis settings.
        spark: Spark settings.
        state_dir: Checkpoints (unless ``spark.checkpoint_url``) and logs.
        options: Per processor name, its ``REFOLD_<PROCESSOR>__*`` variables (strings as in an
            environment, or an options model).
        log_level: ``REFOLD_LOG_LEVEL`` when set.
        schema_registry: The registry of registry-framed records (``REFOLD_SCHEMA_REGISTRY__*``,
            passed when its URL is set).
    """

    kafka: KafkaSettings
    redis: RedisSettings
    spark: SparkSettings
    state_dir: Path
    options: Mapping[str, Mapping[str, str] | BaseModel] = field(default_factory=dict)
    log_level: str | None = None
    schema_registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)

    def env(self) -> dict[str, str]:
        """Every setting as ``REFOLD_*`` variables, to add to the child's environment."""
        env = {
            **settings_env("REFOLD_KAFKA", self.kafka),
            **settings_env("REFOLD_REDIS", self.redis),
            **settings_env("REFOLD_SPARK", self.spark),
            "REFOLD_STATE_DIR": str(self.state_dir),
        }
        if self.schema_registry.url:
            env.update(settings_env("REFOLD_SCHEMA_REGISTRY", self.schema_registry))
        for name, block in self.options.items():
            if isinstance(block, BaseModel):
                env.update(settings_env(options_env_prefix(name).removesuffix("__"), block))
            else:
                env.update(block)
        if self.log_level:
            env["REFOLD_LOG_LEVEL"] = self.log_level
        return env

    def argv(self, names: Sequence[str], **flags: Any) -> list[str]:
        """The command line (see :func:`process_argv` for the flags)."""
        return process_argv(names, **flags)
