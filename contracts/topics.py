"""Topic specs: what a topic carries; contract sets (see :mod:`~.registry`) declare them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from refold.contracts.schema_registry import Framing

__all__ = [
    "RETENTION_KEYS",
    "TopicSpec",
    "dead_letter_spec",
    "dead_letter_topic",
    "effects_spec",
]

RETENTION_KEYS = ("retention.ms", "retention.bytes")
"""The topic configs a spec's ``retention_ms`` / ``retention_bytes`` set (and only they)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A Kafka topic and the events it carries.

    Attributes:
        name: Topic name.
        partitions: Partition count (fixes per-key order: records with one key stay on one
            partition; changing it remaps keys, so it is part of the contract).
        key_field: The event field used as the record key (the aggregate id).
        event_types: Record names allowed on the topic.
        replication_factor: None: the cluster's ``default.replication.factor`` (1 on the local
            stack; 3 is usual in production, with ``min.insync.replicas`` 2).
        config: Topic configs set when the topic is created (``cleanup.policy=compact`` for
            a topic that keeps the latest record per key). Not retention: that is
            ``retention_ms`` / ``retention_bytes``.
        event_time_field: An output stream's event-time field: its producing processor writes
            watermark markers to every partition with its outputs
            (:mod:`refold.contracts.watermarks`), and an event-time processor that folds it
            judges lateness per upstream stream (docs/event-time.md, "Across chains").
        retention_ms: How long the topic keeps a record (``retention.ms``), -1 forever; None:
            the broker's default (``log.retention.hours``, 7 days) and ``refold topics`` never
            touches it. Set on creation, and ``refold topics`` alters an existing topic whose
            value differs. Retention deletes the head of the log (docs/commands.md, "Topics and
            retention").
        retention_bytes: The most a partition keeps (``retention.bytes``), -1 no limit; None:
            the broker's default (no limit), as ``retention_ms``.
        framing: How the topic's producers (the producer SDK, HTTP ingest, a processor's
            outputs) write its records: ``single-object`` (Avro single-object encoding, no
            server) or ``registry`` (``00`` + schema id, with a schema registry;
            docs/schema-registry.md). None: its contract set's ``framing``. Readers decode
            either on every topic, whatever this says (a topic moving over holds both).
    """

    name: str
    partitions: int
    key_field: str
    event_types: tuple[str, ...]
    replication_factor: int | None = None
    config: tuple[tuple[str, str], ...] = ()
    event_time_field: str | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    framing: Framing | None = None

    def __post_init__(self) -> None:
        if self.framing is not None and self.framing not in get_args(Framing):
            msg = (
                f"topic {self.name}: framing must be one of {', '.join(get_args(Framing))}, "
                f"got {self.framing!r}"
            )
            raise ValueError(msg)
        if self.partitions < 1:
            msg = f"topic {self.name}: partitions must be >= 1, got {self.partitions}"
            raise ValueError(msg)
        if not self.event_types:
            msg = f"topic {self.name}: no event types"
            raise ValueError(msg)
        for field, value in (
            ("retention_ms", self.retention_ms),
            ("retention_bytes", self.retention_bytes),
        ):
            # type(), not isinstance: True is an int, and a mistake, not 1 ms.
            if value is not None and (type(value) is not int or (value < 1 and value != -1)):
                msg = (
                    f"topic {self.name}: {field} must be a positive integer, or -1 for "
                    f"unlimited, got {value!r}"
                )
                raise ValueError(msg)
        declared = sorted({key for key, _ in self.config} & set(RETENTION_KEYS))
        if declared:
            fields = ", ".join(key.replace(".", "_") for key in declared)
            msg = (
                f"topic {self.name}: {', '.join(declared)} in config; declare it as {fields}= "
                "(refold topics applies it to existing topics too)"
            )
            raise ValueError(msg)

    @property
    def retention(self) -> dict[str, str]:
        """The retention configs the spec sets (``retention.ms``, ``retention.bytes``), as strings.

        Empty when it sets none: the topic keeps the broker's defaults.
        """
        values = zip(RETENTION_KEYS, (self.retention_ms, self.retention_bytes), strict=True)
        return {key: str(value) for key, value in values if value is not None}

    @property
    def topic_config(self) -> dict[str, str]:
        """Every config the topic is created with: ``config`` and the retention."""
        return {**dict(self.config), **self.retention}


def dead_letter_topic(processor: str, custom: str | None = None) -> str:
    """A processor's dead-letter topic: its ``dead_letter_topic`` option, else ``<processor>.dlq``.

    The one place this rule lives: the processor that sends dead letters, the archive's
    commands and ``refold dlq`` / ``refold topics`` all resolve the name here.

    Args:
        processor: The processor's name.
        custom: The processor's ``dead_letter_topic`` option
            (``REFOLD_<PROCESSOR>__DEAD_LETTER_TOPIC``); None or empty for the default.
    """
    return custom or f"{processor}.dlq"


def effects_spec(name: str) -> TopicSpec:
    """An output topic of side effects (JSON records keyed by entity)."""
    return TopicSpec(name, 4, "(entity key)", ("(side effect)",))


def dead_letter_spec(processor: str, custom: str | None = None) -> TopicSpec:
    """A dead-letter topic as a spec: one partition, any record, original key.

    One partition keeps dead letters in the order they were found; the volume is small.

    Args:
        processor: The processor (or other sender, such as a webhook dispatcher) it belongs to.
        custom: Its name when it is not ``<processor>.dlq`` (see :func:`dead_letter_topic`).
    """
    return TopicSpec(dead_letter_topic(processor, custom), 1, "(original key)", ("(any)",))
