"""What a processor's spec and fold must agree on before its query starts (driver side)."""

from __future__ import annotations

import logging

from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.processors import (
    EventId,
    EventTime,
    ProcessorSpec,
    StateTtl,
)
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying, KeyingError, plan_keying
from refold.processors.runtime.engines import engine_of
from refold.processors.runtime.run_plan import (
    RunOptions,
)

logger = logging.getLogger(__name__)


def plan_keying_of(
    spec: ProcessorSpec, topics: list[TopicSpec], kafka: KafkaSettings, options: RunOptions
) -> Keying:
    """Co-partitioned or re-keyed, from the topics as the broker has them (created if missing)."""
    ensure_topics(kafka.as_librdkafka(), topics)
    probe = LogOffsets(kafka.as_librdkafka())
    try:
        counts = {t.name: len(probe.partitions(t.name)) for t in topics}
    finally:
        probe.close()
    try:
        keying = plan_keying(
            spec.key,
            [(t.name, t.key_field, counts[t.name]) for t in topics],
            [(link.via, link.key) for link in spec.key_links],
            options.max_tasks or 1,
        )
    except KeyingError as exc:
        raise ProcessorConfigError(str(exc)) from exc
    logger.info("%s: %s", spec.name, keying.reason)
    if keying.slots and not options.source_format.startswith("refold_kafka_ranges"):
        msg = (
            f"{spec.name} is re-keyed ({keying.reason}): it needs source_format "
            "refold_kafka_ranges, where each writer slot reads the batch's ranges itself"
        )
        raise ProcessorConfigError(msg)
    return keying


def check_dedupe(projection: Projection, dedupe: EventId | None) -> None:
    """De-duplication by event id is a rule of entity folds: refuse it anywhere else."""
    if dedupe is None:
        return
    engine = engine_of(projection)
    if not engine.dedupes:
        msg = (
            f"{projection.name} is {engine.called}, but its spec declares dedupe=, which only "
            "entity folds apply. Operator action: remove dedupe from its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)


def check_state_ttl(
    projection: Projection, state_ttl: StateTtl | None, event_time: EventTime | None
) -> None:
    """State that expires is a rule of entity folds with an event time: refuse it elsewhere."""
    if state_ttl is None:
        return
    kind = engine_of(projection).state_kind(projection) or "none"
    if kind != "entity" or event_time is None:
        what = "has no event_time" if event_time is None else f"is not an entity fold ({kind})"
        msg = (
            f"{projection.name} {what}, but its spec declares state_ttl=, which only entity "
            "folds with an event time apply. Operator action: remove state_ttl from its "
            "ProcessorSpec, or declare its event_time."
        )
        raise ProcessorConfigError(msg)


def check_event_time(
    projection: Projection, event_time: EventTime | None, keying: Keying | None
) -> None:
    """What the engine requires of the event time and the keying (ProcessorConfigError).

    Windows need an event time; a lookup fold is not re-keyed; a DataFrame processor has none:
    its watermark is Spark's, in its transform.
    """
    engine_of(projection).check_spec(projection, event_time, keying)


def check_marker_source(
    projection: Projection, topics: list[TopicSpec], options: RunOptions
) -> None:
    """A fold over an output stream with watermark markers needs a source that reads headers.

    Markers are told apart by their header (docs/event-time.md, "Across chains"); Spark's
    ``kafka`` and refold's ``refold_kafka`` row sources carry none, so each marker would go to
    the dead-letter topic as an undecodable record. Refused at start, naming the fix.
    """
    if engine_of(projection).skips_markers:
        return  # it tells markers apart itself
    if options.source_format.startswith("refold_kafka_ranges"):
        return
    marked = [t.name for t in topics if t.event_time_field]
    if marked:
        msg = (
            f"{projection.name} reads {', '.join(marked)}, which carry watermark markers in "
            f"record headers, and source_format {options.source_format!r} reads no headers: "
            "use source_format 'refold_kafka_ranges' (the default)"
        )
        raise ProcessorConfigError(msg)
