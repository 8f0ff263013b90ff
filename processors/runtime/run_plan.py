"""Where a processor run starts: its generation, checkpoint and starting offsets (driver side).

Starting offsets, in order of precedence:
1. the generation's Spark checkpoint, when it has one (Spark resumes from it);
2. the positions the generation has applied in Redis (a lost checkpoint is not a lost state);
3. ``--starting-offsets`` (``earliest``, ``latest`` or Spark's JSON form), default earliest.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import redis

from refold.contracts.fingerprints import NOTHING_DECLARED, DeclaredCode
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.offsets_json import to_offsets_json
from refold.contracts.layout import position_field
from refold.contracts.processors import (
    EventId,
    EventTime,
    ProcessorSpec,
    SourceFormat,
    StateTtl,
)
from refold.contracts.registry import default_registry, with_fallback
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.catch_up import CATCH_UP_FIELD, CATCH_UP_PENDING, target_field
from refold.contracts.store.connect import is_cluster
from refold.contracts.store.generations import (
    AS_OF_FIELD,
    CHECKPOINT_EPOCH_FIELD,
    RESET_PENDING_FIELD,
    SHARDS_FIELD,
    SLOTS_FIELD,
    GenerationRegistry,
)
from refold.contracts.store.outage import wait_out_redis
from refold.contracts.topics import TopicSpec, dead_letter_topic
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying
from refold.processors.runtime.checkpoints import (
    checkpoint_location,
    has_batches,
    remove_stale_checkpoint,
)
from refold.processors.runtime.code_identity import build_fingerprints, check_resume
from refold.processors.runtime.engines import engine_of
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.kafka_ranges import resolve_starting_offsets
from refold.processors.runtime.shards import wanted_shards

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


GenerationChoice = Literal["live", "new"] | int


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run a processor.

    Attributes:
        generation: ``live`` (the alias; the first run creates generation 1 and makes it live),
            ``new`` (a new building generation) or a generation number.
        checkpoint_root: Spark checkpoints live in ``<root>/<processor>/g<N>``: a path or a URL
            (:mod:`refold.processors.runtime.checkpoints`).
        starting_offsets: Used only when neither a checkpoint nor Redis positions exist.
        available_now: Process what is in the log at start, then stop (replay catch-up, batch
            runs); micro-batches still respect ``max_offsets_per_trigger``.
        ending_offsets: Spark offsets JSON: per partition, the offset the run stops before
            (``replay --until``: a state as of a moment); "" for none. Implies stopping once
            there, as ``available_now`` does at the log end.
        trigger_interval: Processing-time trigger; keeps the idle ``latestOffset`` calls cheap.
        max_offsets_per_trigger: Cap on records per micro-batch (None: no cap).
        max_tasks: Spark tasks per micro-batch; on 2 cores fewer, larger tasks are faster.
        source_format: ``refold_kafka_ranges`` (the Python source planning offset ranges; each
            task reads its records in the worker that folds them), ``refold_kafka`` (the same
            source yielding records) or ``kafka`` (Spark's JVM source, where its jar exists).
        dead_letter_topic: Default ``<processor>.dlq``.
        windows_topic: Where closed windows go; default ``<processor>.windows``.
        accept_code_change: Resume a generation whose code fingerprint differs (and record
            the new one) instead of refusing.
        lease_wait_s: How long a start waits for another processor to let go of the
            generation (e.g. replay's processor finishing its last batch after a cutover).
        archive_root: The archive that serves reads below a partition's log start (the
            log's cold tier, :mod:`refold.processors.runtime.archive.cold_tier`); "": none.
    """

    generation: GenerationChoice = "live"
    checkpoint_root: str | Path = ".state/checkpoints"
    starting_offsets: str = "earliest"
    available_now: bool = False
    ending_offsets: str = ""
    trigger_interval: str = "250 milliseconds"
    max_offsets_per_trigger: int | None = 200_000
    max_tasks: int | None = 2
    source_format: SourceFormat = "refold_kafka_ranges"
    dead_letter_topic: str | None = None
    windows_topic: str | None = None
    accept_code_change: bool = False
    # A processor stopping after a cutover finishes its micro-batch first (SIGTERM), which
    # takes seconds; two minutes also covers a slow batch without hiding a real duplicate.
    lease_wait_s: float = 120.0
    archive_root: str = ""


@dataclass(frozen=True, slots=True)
class ProcessorJob:
    """One processor query to run: its spec, its fold, its topics and how to run it."""

    spec: ProcessorSpec
    projection: Projection
    topics: list[TopicSpec]
    options: RunOptions


@dataclass(frozen=True, slots=True)
class ProcessorRun:
    """A resolved run: which generation, where its checkpoint is, where it starts."""

    generation: int
    checkpoint: str
    starting_offsets: str
    target: FoldTarget


def resolve_run(
    projection: Projection,
    topics: list[TopicSpec],
    kafka: KafkaSettings,
    redis_settings: RedisSettings,
    options: RunOptions,
    client: redis.Redis,
    keying: Keying | None = None,
    event_time: EventTime | None = None,
    dedupe: EventId | None = None,
    declared: DeclaredCode = NOTHING_DECLARED,
    state_ttl: StateTtl | None = None,
) -> ProcessorRun:
    """Pick the generation, checkpoint and starting offsets (creating the generation if asked)."""
    registry = GenerationRegistry.of(client, projection.name, redis_settings.key_prefix)
    fingerprints = build_fingerprints(projection, declared)
    shards = wanted_shards(
        projection, topics, keying, redis_settings.shard_state, is_cluster(client)
    )
    meta = {
        "topics": [t.name for t in topics],
        "starting_offsets": options.starting_offsets,
        SLOTS_FIELD: str(keying.slots if keying else 0),
        SHARDS_FIELD: str(shards),
        **fingerprints,
    }
    created = False
    if options.generation == "live":
        live = registry.live()
        if live is None:
            # Readers see it at once: they answer "rebuilding" until it has caught up with the
            # log end taken when it starts (record_starting_positions sets that target).
            first: dict[str, Any] = {**meta, CATCH_UP_FIELD: CATCH_UP_PENDING}
            generation, created = registry.create(first, live=True), True
        else:
            generation = live
    elif options.generation == "new":
        generation, created = registry.create(meta), True
    else:
        generation = options.generation
        status = registry.status(generation)
        if status is None:
            msg = f"{projection.name} has no generation {generation}; see `replay status`"
            raise ProcessorConfigError(msg)
        if status == "as_of":
            moment = registry.meta(generation).get(AS_OF_FIELD, "?")
            msg = (
                f"{projection.name} g{generation} is the state as of {moment} (replay --until): "
                "folding on would change it. Operator action: replay again with a later --until."
            )
            raise ProcessorConfigError(msg)
    if not created:
        pending = registry.meta(generation).get(RESET_PENDING_FIELD)
        if pending:
            msg = (
                f"{projection.name} g{generation} is half reset: an in-place reset ({pending}) "
                "did not finish. Operator action: run that `replay --in-place --execute` "
                "again, or rebuild online and flip to the new generation."
            )
            raise ProcessorConfigError(msg)
        check_resume(registry, projection, generation, options.accept_code_change, declared)
    described = engine_of(projection).generation_meta(projection)
    if described:  # readers (the query API) build the windows from it, without the code
        registry.update_meta(generation, described)
    epoch = int(registry.meta(generation).get(CHECKPOINT_EPOCH_FIELD, "0"))
    checkpoint = checkpoint_location(
        str(options.checkpoint_root), projection.name, generation, epoch
    )
    if created:
        remove_stale_checkpoint(checkpoint)
    starting = options.starting_offsets
    if not has_batches(checkpoint):
        positions, _ = registry.positions(generation)
        if positions:
            starting = to_offsets_json(positions)
            logger.info("no checkpoint: resuming g%d from its Redis positions", generation)
    target = FoldTarget(
        processor=projection.name,
        generation=generation,
        code_fingerprint=fingerprints["code_fingerprint"],
        declared_code=declared,
        archive_root=options.archive_root,
        created_at=registry.meta(generation).get("created_at", ""),
        redis_url=redis_settings.client_url(),
        key_prefix=redis_settings.key_prefix,
        kafka=tuple(sorted(kafka.as_librdkafka().items())),
        dlq_topic=dead_letter_topic(projection.name, options.dead_letter_topic),
        event_time=event_time,
        dedupe=dedupe,
        state_ttl=state_ttl,
        topics=tuple(t.name for t in topics),
        **_keying_fields(registry, generation, keying),
        shards=_shards(registry, generation, shards),
    )
    target = dataclasses.replace(target, **stream_fields(projection, topics, target.slots))
    return ProcessorRun(generation, checkpoint, starting, target)


def _shards(registry: GenerationRegistry, generation: int, wanted: int) -> int:
    """A generation's shards: as recorded, else ``wanted`` if it has written nothing yet.

    A processor records them when it creates a generation; one that a replay created is
    decided by its first run, as its writer slots are; a generation written before refold
    sharded (no record) is kept unsharded. Never changed once recorded.
    """
    recorded = registry.meta(generation).get(SHARDS_FIELD, "")
    if recorded:
        return int(recorded)
    fresh = not registry.positions(generation).positions
    return registry.decide_shards(generation, wanted if fresh else 0)


def stream_fields(
    projection: Projection,
    topics: list[TopicSpec],
    slots: int,
    known: dict[str, TopicSpec] | None = None,
) -> dict[str, Any]:
    """The target's watermark-marker fields (docs/event-time.md, "Across chains").

    ``marked``: the effect topics whose spec declares an event-time field (this processor
    writes markers there); ``streams``: its topics' partitions times its writer slots;
    ``stream_topics``: its own topics that carry markers. ``known``: the topic specs by name
    (default: the installed contract sets').
    """
    empty: Mapping[str, TopicSpec] = {}
    specs = known if known is not None else with_fallback(lambda: default_registry().topics, empty)
    marked = []
    for name in getattr(projection, "effect_topics", ()) or ():
        spec = specs.get(name)
        if spec is not None and spec.event_time_field:
            marked.append((name, spec.event_time_field))
    return {
        "marked": tuple(marked),
        "streams": sum(t.partitions for t in topics) * max(1, slots),
        "stream_topics": tuple(t.name for t in topics if t.event_time_field),
    }


def _keying_fields(
    registry: GenerationRegistry, generation: int, keying: Keying | None
) -> dict[str, Any]:
    """The target's keying: a generation's writer slots never change once it has some."""
    if keying is None:
        return {}
    slots = keying.slots
    recorded = registry.meta(generation).get(SLOTS_FIELD)
    if recorded is None:
        registry.update_meta(generation, {SLOTS_FIELD: str(slots)})
    elif int(recorded) != slots:
        logger.warning(
            "g%d was built with %s writer slots; keeping them (not %d): an entity's slot must "
            "not change within a generation",
            generation,
            recorded,
            slots,
        )
        slots = int(recorded)
    if not slots and keying.slots:
        msg = (
            f"g{generation} was built co-partitioned, but its topics are not any more "
            f"({keying.reason}). Operator action: rebuild it with replay --to-earliest --execute."
        )
        raise ProcessorConfigError(msg)
    return {
        "slots": slots,
        "key_field": keying.key_field,
        "key_links": keying.via,
        "partition_keys": keying.partition_keys,
    }


# A processor starting while Redis is away waits this long for it before giving up.
_REDIS_START_WAIT_S = 300.0


def until_redis_answers(
    call: Callable[[], _T], redis_settings: RedisSettings, client: redis.Redis, who: str
) -> _T:
    """Run ``call``, waiting (bounded) while Redis is unreachable.

    Raises:
        RedisCredentialsError: Redis refused ``client``'s login (``who`` in the message).
        ProcessorConfigError: Redis did not answer within the start budget.
    """

    def give_up(_waited: float, exc: Exception) -> ProcessorConfigError:
        return ProcessorConfigError(
            f"Redis at {redis_settings.url} unreachable for {_REDIS_START_WAIT_S:.0f}s: {exc}. "
            "Operator action: start Redis, or fix REFOLD_REDIS__URL."
        )

    return wait_out_redis(
        call, who, client, give_up, patience_s=_REDIS_START_WAIT_S, first_delay_s=0.5
    )


def record_starting_positions(
    run: ProcessorRun, registry: GenerationRegistry, kafka: KafkaSettings, topics: list[TopicSpec]
) -> ProcessorRun:
    """Before a generation's first batch, record where it starts as its applied positions.

    From then on every partition has a position in Redis, so a position that is missing or
    lower than Spark's plan can only mean Redis lost writes, and the sink folds the gap again
    (DESIGN.md decision 9). The source is given the same concrete offsets.
    """
    applied = registry.positions(run.generation).positions
    # Sharded, the shards are started one by one: a start cut short resumes (HSETNX).
    started = len(applied) >= sum(t.partitions for t in topics) or not run.target.shards
    if has_batches(run.checkpoint) or (applied and started):
        return run
    probe = LogOffsets(kafka.as_librdkafka())
    try:
        resolved = resolve_starting_offsets(
            probe,
            [t.name for t in topics],
            run.starting_offsets,
            archive_root=run.target.archive_root,
        )
    except ValueError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    finally:
        probe.close()
    _record_catch_up(registry, run.generation, kafka, resolved)
    keys = registry.keys(run.generation)
    start = run.target.positions(registry.client)  # re-keyed: every writer slot starts there
    # One transaction; sharded, none spans the shards' slots (each command is idempotent).
    with registry.client.pipeline(transaction=not keys.shards) as pipe:
        for (topic, partition), offset in sorted(resolved.items()):
            field_name = position_field(topic, partition)
            start.start(pipe, field_name, offset)
            pipe.set(keys.for_shard(partition).guard(field_name), offset, nx=True)
        pipe.execute()
    starting = to_offsets_json(registry.positions(run.generation)[0])
    logger.info("g%d starts at %s", run.generation, starting)
    return dataclasses.replace(run, starting_offsets=starting)


def _record_catch_up(
    registry: GenerationRegistry,
    generation: int,
    kafka: KafkaSettings,
    starts: Mapping[tuple[str, int], int],
) -> None:
    """Replace a live generation's ``pending`` catch-up mark with the log end it must reach.

    Before its positions are written, so a start cut short leaves it pending and the next
    start sets it (:mod:`refold.contracts.store.catch_up`). Other generations have no mark.
    """
    if registry.meta(generation).get(CATCH_UP_FIELD) != CATCH_UP_PENDING:
        return
    probe = LogOffsets(kafka.as_librdkafka())
    try:
        ends = probe.end_offsets(list(starts))
    finally:
        probe.close()
    meta = registry.layout.generation(generation).meta
    value = target_field(starts, ends)
    if value is None:
        registry.client.hdel(meta, CATCH_UP_FIELD)
    else:
        registry.client.hset(meta, CATCH_UP_FIELD, value)
        logger.info("g%d catches up to the log end %s: readers wait until then", generation, value)
