"""What a processor's spec and fold must agree on before its query starts (driver side)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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
from refold.processors.fold.archive import is_archive_processor
from refold.processors.fold.dataframe import is_dataframe_processor
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying, KeyingError, plan_keying
from refold.processors.runtime.run_plan import (
    RunOptions,
)

if TYPE_CHECKING:
    pass

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
    kind = (
        "a DataFrame processor"
        if is_dataframe_processor(projection)
        else "an archive"
        if is_archive_processor(projection)
        else "a window fold"
        if getattr(projection, "windows", None)
        else "a lookup fold"
        if getattr(projection, "lookup", None)
        else None
    )
    if kind is not None:
        msg = (
            f"{projection.name} is {kind}, but its spec declares dedupe=, which only entity "
            "folds apply. Operator action: remove dedupe from its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)


def check_state_ttl(
    projection: Projection, state_ttl: StateTtl | None, event_time: EventTime | None
) -> None:
    """State that expires is a rule of entity folds with an event time: refuse it elsewhere."""
    if state_ttl is None:
        return
    # Imported here: the kinds import the writer's modules, which a start check need not load.
    from refold.processors.runtime.kinds import kind_of

    keyless = is_dataframe_processor(projection) or is_archive_processor(projection)
    kind = "none" if keyless else kind_of(projection)[0]
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
    """Windows need an event time; lookups need entities owned by partitions.

    A DataFrame processor has none: its watermark is Spark's, in its transform.
    """
    name = projection.name
    if event_time is not None and is_dataframe_processor(projection):
        msg = (
            f"{name} is a DataFrame processor, whose lateness is Spark's (withWatermark in its "
            "transform), but its spec declares an event_time that nothing would apply. "
            "Operator action: remove event_time from its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)
    if getattr(projection, "windows", None) and event_time is None:
        msg = (
            f"{name} declares windows but its spec has no event_time. Operator action: add "
            "event_time=EventTime(field=...) to its ProcessorSpec."
        )
        raise ProcessorConfigError(msg)
    if (
        event_time is not None
        and keying is not None
        and keying.slots
        and getattr(projection, "lookup", None)
    ):
        # Re-keyed with an event time: lateness is judged per source partition by every
        # writer slot (processors/runtime/lateness.py), and timers fire on each slot's
        # watermark over every partition (processors/fold/timers.py). A lookup fold keeps no
        # state per entity (its events wait in one pending set, scored by event time, and its
        # lookup_key picks the table row whatever the processor's key), so re-keying it would
        # only cost every slot a read of every record; it is not built, nor tested, re-keyed.
        msg = (
            f"{name} has a lookup but is re-keyed ({keying.reason}). A lookup fold keeps no "
            "state per entity, and its lookup_key picks the table's row whatever the "
            "processor's key, so it needs no re-keying. Operator action: declare the topics' "
            "partition key as its key."
        )
        raise ProcessorConfigError(msg)


def check_marker_source(
    projection: Projection, topics: list[TopicSpec], options: RunOptions
) -> None:
    """A fold over an output stream with watermark markers needs a source that reads headers.

    Markers are told apart by their header (docs/event-time.md, "Across chains"); Spark's
    ``kafka`` and refold's ``refold_kafka`` row sources carry none, so each marker would go to
    the dead-letter topic as an undecodable record. Refused at start, naming the fix.
    """
    if is_dataframe_processor(projection) or is_archive_processor(projection):
        return  # they skip markers themselves
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
