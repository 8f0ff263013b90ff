"""The data-lake archive's rules: typed Parquet tables of events, file names by coverage (pure).

An archive processor (:class:`ArchiveProcessor`) writes every event of its topics as a row of a
Parquet table, one table per event type, partitioned by the event's date (UTC)::

    <root>/<EventType>/event_date=YYYY-MM-DD/<topic>~p<partition>~<start>-<end>.parquet

A file holds the events of one type and one date found in ``[start, end)`` of one Kafka
partition, in offset order: its name says which range of the log it *covers* (every event of
that type and date in the range is in it, and nothing else). The directories are Hive-style
partitions, read as they are by ``pyarrow.dataset(partitioning="hive")``, DuckDB's
``read_parquet(..., hive_partitioning=true)`` and ``spark.read.parquet``.

Columns: the fields of the event type's reader schema (Avro types mapped by
:func:`arrow_type`: ``timestamp-millis`` as ``timestamp[ms, UTC]``, decimals on ``bytes`` or
``fixed`` as ``decimal128`` (``decimal256`` above 38 digits), enums as strings, records, arrays
and maps as structs, lists and maps, nullable unions as nullable columns; the walk is
:mod:`refold.processors.fold.avro_types`'s), then where the row comes from
(:data:`META_COLUMNS`): ``kafka_topic``, ``kafka_partition``, ``kafka_offset``,
``kafka_timestamp``, ``kafka_key`` and the writer's ``schema_version``. So "the archive equals
the log, event for event" is checkable by ``(topic, partition, offset)``. And what a replay
needs to hand a record over as Kafka would (the archive is the log's cold tier, DESIGN.md
decision 20): ``kafka_value`` (the record's bytes), ``kafka_headers`` and
``kafka_timestamp_type``. A record that is no event of an archivable type (it does not decode,
its type has no Parquet form, a watermark marker) is kept in the bookkeeping table
:data:`RAW_TABLE` with the meta columns only, so every record of a covered range is in exactly
one file.

The redundancy rule (:func:`redundant`): in one directory, a file whose range lies within
another file's range of the same partition holds nothing that file lacks, and is deleted. It
makes compaction and backfill crash-safe: they write the covering file first and delete the
small ones after, and a crash in between is repaired by applying the rule again.

Nothing here does I/O; the writer, the store and the commands are in ``refold.processors.runtime``
(``processors.runtime.archive``: its store, sink, maintenance and CLI).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from refold.contracts.errors import ContractError
from refold.contracts.processors import EventTime
from refold.processors.fold.avro_types import (
    AvroField,
    AvroTypeWalker,
    Conversion,
    LogicalType,
    Primitive,
    Walked,
    array_conversion,
    convert,
    map_conversion,
    record_conversion,
)

__all__ = [
    "DATE_PREFIX",
    "META_COLUMNS",
    "RAW_TABLE",
    "ArchiveProcessor",
    "ArchiveSchemaError",
    "ArchiveTable",
    "Coverage",
    "RecordBytes",
    "arrow_type",
    "date_dir",
    "day_of",
    "is_archive_processor",
    "overlapping",
    "parse_date_dir",
    "redundant",
]

# The Hive partition column: its directories are ``event_date=YYYY-MM-DD``.
DATE_PREFIX = "event_date="
# Where each row comes from, after the event's own fields. Names no event field may take.
META_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("kafka_topic", pa.string(), nullable=False),
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
    pa.field("kafka_timestamp", pa.timestamp("ms", tz="UTC")),  # null: the broker gave none
    pa.field("kafka_key", pa.binary()),
    pa.field("schema_version", pa.int32(), nullable=False),  # the writer schema's version; 0: none
    # What the log held, for a replay from the archive (null in files written before them).
    pa.field("kafka_value", pa.binary()),
    pa.field(
        "kafka_headers",
        pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
    ),
    pa.field("kafka_timestamp_type", pa.int8()),
)
# The table of records that are no archivable event (see the module's docstring). Its name
# starts with "_": readers of the event tables and the maintenance commands skip it.
RAW_TABLE = "_raw"
_META_NAMES = frozenset(f.name for f in META_COLUMNS)
_DAY_MS = 86_400_000
_EPOCH = dt.date(1970, 1, 1)
_FIRST_DAY, _LAST_DAY = (dt.date.min - _EPOCH).days, (dt.date.max - _EPOCH).days
# Kafka topic names are [a-zA-Z0-9._-]: '~' never occurs in one, so names parse back exactly.
_FILE_NAME = re.compile(
    r"^(?P<topic>[A-Za-z0-9._-]+)~p(?P<partition>\d+)~(?P<start>\d+)-(?P<end>\d+)\.parquet$"
)
_DATE_DIR = re.compile(r"^event_date=(\d{4}-\d{2}-\d{2})$")


class ArchiveSchemaError(ContractError):
    """An event type's schema has no Parquet column type, or clashes with the meta columns."""

    code = "ARCHIVE_SCHEMA"


# -- Avro -> Arrow ------------------------------------------------------------------------------

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# Arrow takes the decoded numbers of these as they are (epoch ms or us, days, time of day).
_LOGICAL: dict[LogicalType, pa.DataType] = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "uuid": pa.string(),
}
# decimal128 holds at most 38 digits; wider decimals are decimal256 (up to 76).
_DECIMAL128_MAX_PRECISION = 38


class _ArrowTypes:
    """Avro -> ``(Arrow type, conversion)``: the archive's emitter.

    An :class:`~refold.processors.fold.avro_types.AvroVisitor`. Only decimals need a
    conversion (``None`` for everything else: ints for times and dates, str for enums).
    """

    def error(self, message: str) -> ArchiveSchemaError:
        return ArchiveSchemaError(message)

    def primitive(self, name: Primitive, at: str) -> tuple[pa.DataType, Conversion]:
        return _PRIMITIVES[name], None

    def logical(self, kind: LogicalType, at: str) -> tuple[pa.DataType, Conversion]:
        return _LOGICAL[kind], None

    def decimal(self, precision: int, scale: int, at: str) -> tuple[pa.DataType, Conversion]:
        wide = precision > _DECIMAL128_MAX_PRECISION
        decimal = pa.decimal256 if wide else pa.decimal128
        return decimal(precision, scale), ("decimal", scale)

    def fixed(self, size: int) -> tuple[pa.DataType, Conversion]:
        return pa.binary(size), None

    def enum(self, symbols: Sequence[str]) -> tuple[pa.DataType, Conversion]:
        return pa.string(), None

    def record(
        self, name: str, fields: Sequence[AvroField[tuple[pa.DataType, Conversion]]]
    ) -> tuple[pa.DataType, Conversion]:
        struct = pa.struct([pa.field(f.name, f.type[0], nullable=f.nullable) for f in fields])
        return struct, record_conversion([(f.name, f.type[1]) for f in fields])

    def array(
        self, items: Walked[tuple[pa.DataType, Conversion]]
    ) -> tuple[pa.DataType, Conversion]:
        kind, conversion = items.type
        listed = pa.list_(pa.field("element", kind, nullable=items.nullable))
        return listed, array_conversion(conversion)

    def map(self, values: Walked[tuple[pa.DataType, Conversion]]) -> tuple[pa.DataType, Conversion]:
        kind, conversion = values.type
        mapped = pa.map_(pa.string(), pa.field("value", kind, nullable=values.nullable))
        return mapped, map_conversion(conversion)


def arrow_type(schema: Any, where: str = "schema") -> tuple[pa.DataType, bool]:
    """The Arrow type of an Avro type, and whether it is nullable (a union with null).

    Raises:
        ArchiveSchemaError: A union of several non-null types (Parquet has no union column),
            or a type not defined before its use.
    """
    walked = AvroTypeWalker(_ArrowTypes(), where).walk(schema)
    return walked.type[0], walked.nullable


# -- event dates --------------------------------------------------------------------------------


@lru_cache(maxsize=65_536)
def _day_text(day: int) -> str:
    return (_EPOCH + dt.timedelta(days=day)).isoformat()


def day_of(epoch_ms: Any) -> str | None:
    """The UTC date (``YYYY-MM-DD``) of an epoch-milliseconds time; None when it has none."""
    if not isinstance(epoch_ms, int) or isinstance(epoch_ms, bool):
        return None
    day = epoch_ms // _DAY_MS
    if not _FIRST_DAY <= day <= _LAST_DAY:
        return None
    return _day_text(day)


def date_dir(root: Path, event_type: str, date: str) -> Path:
    """The directory of one table's date partition."""
    return root / event_type / f"{DATE_PREFIX}{date}"


def parse_date_dir(name: str) -> str | None:
    """The date of an ``event_date=YYYY-MM-DD`` directory name (None: not one)."""
    match = _DATE_DIR.match(name)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class ArchiveTable:
    """One event type's table: its Arrow schema and how a decoded event becomes a row.

    Attributes:
        event_type: The record name (the table's directory).
        schema: Arrow schema of its files: the reader schema's fields, then the meta columns.
        time_field: The field whose UTC date partitions it (epoch ms), or None: the Kafka
            timestamp's date.
        conversions: Per field needing one, how its decoded value becomes Arrow's (decimals).
    """

    event_type: str
    schema: pa.Schema
    time_field: str | None
    conversions: tuple[tuple[str, Conversion], ...] = ()

    @classmethod
    def of(
        cls, reader: Mapping[str, Any], dates: EventTime | None, fingerprint: str = ""
    ) -> ArchiveTable:
        """The table of a reader schema (Avro JSON of a record).

        Args:
            reader: The event type's reader schema.
            dates: Which field dates each event type (``field_of``); a type without that
                field (or whose field is not a ``long``/``int``) is dated by its Kafka
                timestamp.
            fingerprint: The reader schema's fingerprint, kept in the files' metadata.

        Raises:
            ArchiveSchemaError: A field has no Parquet type, or is named as a meta column.
        """
        name = str(reader["name"]).rsplit(".", 1)[-1]
        fields, conversions, times = [], [], {}
        for field in reader["fields"]:
            field_name = str(field["name"])
            if field_name in _META_NAMES:
                msg = (
                    f"{name}.{field_name} has the name of a column every archived row has "
                    f"({', '.join(sorted(_META_NAMES))}); rename the field in a new version"
                )
                raise ArchiveSchemaError(msg)
        for typed in AvroTypeWalker(_ArrowTypes(), name).fields(reader):
            field_name, (kind, conversion) = typed.name, typed.type
            fields.append(pa.field(field_name, kind, nullable=typed.nullable))
            if conversion is not None:
                conversions.append((field_name, conversion))
            times[field_name] = kind
        wanted = dates.field_of(name) if dates is not None else None
        kind = times.get(wanted or "", pa.null())
        # Only epoch milliseconds date an event (timestamp-millis, or a plain long/int); a type
        # without such a field is dated by its Kafka timestamp.
        is_ms = pa.types.is_timestamp(kind) and kind.unit == "ms"
        usable = wanted is not None and (is_ms or kind in (pa.int64(), pa.int32()))
        metadata = {"refold.event_type": name, "refold.reader_fingerprint": fingerprint}
        return cls(
            name,
            pa.schema([*fields, *META_COLUMNS], metadata=metadata),
            wanted if usable else None,
            tuple(conversions),
        )

    @classmethod
    def raw(cls) -> ArchiveTable:
        """The :data:`RAW_TABLE`: the meta columns only, dated by the Kafka timestamp."""
        return cls(
            RAW_TABLE, pa.schema(META_COLUMNS, metadata={"refold.event_type": RAW_TABLE}), None
        )

    def date_of(self, event: Mapping[str, Any], kafka_timestamp: int) -> str:
        """The event's date: its time field's UTC date, else its Kafka timestamp's.

        Deterministic: both are in the log, so every run and every backfill agree.
        """
        if self.time_field is not None:
            day = day_of(event.get(self.time_field))
            if day is not None:
                return day
        return day_of(kafka_timestamp) or _day_text(0)

    def row(
        self,
        event: dict[str, Any],
        origin: tuple[str, int, int, int, bytes | None],
        schema_version: int,
        record: RecordBytes | None = None,
    ) -> dict[str, Any]:
        """The row of one decoded event (the dict is completed in place and returned).

        Args:
            event: The decoded event (fastavro's dict; extended with the meta columns).
            origin: ``(topic, partition, offset, kafka timestamp ms, key)``.
            schema_version: The writer schema's version (0: the record is no event).
            record: What the log held besides (None: not kept, as in older files).
        """
        for name, conversion in self.conversions:
            event[name] = convert(event.get(name), conversion)
        topic, partition, offset, timestamp, key = origin
        event["kafka_topic"] = topic
        event["kafka_partition"] = partition
        event["kafka_offset"] = offset
        event["kafka_timestamp"] = timestamp or None
        event["kafka_key"] = key
        event["schema_version"] = schema_version
        if record is not None:
            event["kafka_value"] = record.value
            event["kafka_headers"] = [
                {"key": k, "value": v.encode() if isinstance(v, str) else v}
                for k, v in record.headers
            ]
            event["kafka_timestamp_type"] = record.timestamp_type
        return event


@dataclass(frozen=True, slots=True)
class RecordBytes:
    """What the log held of a record besides its place: a replay hands it over from these."""

    value: bytes | None
    headers: tuple[tuple[str, str | bytes | None], ...] = ()
    timestamp_type: int = 1


# -- file names and the redundancy rule ----------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Coverage:
    """What range of the log a file covers: ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def file_name(self) -> str:
        """``<topic>~p<partition>~<start>-<end>.parquet``."""
        return f"{self.topic}~p{self.partition}~{self.start}-{self.end}.parquet"

    @classmethod
    def parse(cls, name: str) -> Coverage | None:
        """The coverage of a file name (None: not an archive file)."""
        match = _FILE_NAME.match(name)
        if match is None:
            return None
        start, end = int(match["start"]), int(match["end"])
        if end <= start:
            return None
        return cls(match["topic"], int(match["partition"]), start, end)

    def within(self, other: Coverage) -> bool:
        """True when ``other`` (another file of the same partition) covers all of this one."""
        return (
            self != other
            and (self.topic, self.partition) == (other.topic, other.partition)
            and other.start <= self.start
            and self.end <= other.end
        )


def redundant(files: Iterable[Coverage]) -> list[Coverage]:
    """The files of one directory that lie within another's range (the redundancy rule)."""
    by_partition: dict[tuple[str, int], list[Coverage]] = {}
    for cov in files:
        by_partition.setdefault((cov.topic, cov.partition), []).append(cov)
    out: list[Coverage] = []
    for covs in by_partition.values():
        out.extend(c for c in covs if any(c.within(o) for o in covs))
    return sorted(out)


def overlapping(files: Iterable[Coverage]) -> list[tuple[Coverage, Coverage]]:
    """Pairs of files of one partition whose ranges overlap without one containing the other.

    The writer never makes such pairs (a range is written once, from the applied position);
    one means files were copied in by hand, and some events would be read twice.
    """
    by_partition: dict[tuple[str, int], list[Coverage]] = {}
    for cov in files:
        by_partition.setdefault((cov.topic, cov.partition), []).append(cov)
    pairs = []
    for covs in by_partition.values():
        ordered = sorted(covs)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                if second.start >= first.end:
                    break
                if not (first.within(second) or second.within(first)):
                    pairs.append((first, second))
    return pairs


# -- the processor --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArchiveProcessor:
    """An archive processor: every event of its topics, as Parquet under ``root``.

    Built by the spec's ``projection`` factory (see ``processors/archive``); the runner
    recognises it with :func:`is_archive_processor` and runs it with the archive's own sink.
    Picklable: shipped to executors.

    Attributes:
        name: Processor name (its positions in Redis, its dead-letter topic).
        root: The archive's directory (shared storage on a cluster: every executor writes
            there).
        event_types: The event types of its topics (its schema fingerprints); a record of
            another type that decodes is archived too, in its own table.
        dates: Which field dates each event type; None: every event by its Kafka timestamp.
        compression: Parquet codec (zstd: about 2x smaller than snappy on these events, read
            by pyarrow, DuckDB and Spark alike).
        fsync: Flush each file (and its directory entry) to disk before the position moves,
            so a power cut cannot lose a file the position says is written.
    """

    name: str
    root: Path
    event_types: tuple[str, ...]
    dates: EventTime | None = None
    compression: str = "zstd"
    fsync: bool = True

    def table(self, reader: Mapping[str, Any], fingerprint: str = "") -> ArchiveTable:
        """The table of an event type, from its reader schema."""
        return ArchiveTable.of(reader, self.dates, fingerprint)

    def check(self, readers: Sequence[Mapping[str, Any]]) -> None:
        """Raise :class:`ArchiveSchemaError` unless every reader schema makes a table."""
        for reader in readers:
            self.table(reader)


def is_archive_processor(processor: object) -> bool:
    """True when ``processor`` is an :class:`ArchiveProcessor`."""
    return isinstance(processor, ArchiveProcessor)
