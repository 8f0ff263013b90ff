"""DataFrame processors: a Spark transformation over decoded events, for what Spark does best.

Pure: the protocol, and how decoded Avro events become typed rows. The Spark wiring (decoding in
``mapInArrow``, the query, the exactly-once sink) is :mod:`refold.processors.runtime.dataframe`.

A processor is of this kind when the object its spec's ``projection`` factory returns has a
``transform`` method (:func:`is_dataframe_processor`); every other processor is a Python fold.
Use it where Spark's own operators serve better than a fold: aggregates that need a shuffle
(grouped by a field that is not the partition key, and not additive), stream-stream joins of
events with different keys, ``percentile_approx`` and other non-additive aggregates. The
trade-offs against Redis buckets are in ``docs/event-time.md`` ("Spark-native processors").

Lifecycle and guarantees:

* ``transform`` runs on the driver, once per query start, to build the plan; Spark then runs
  the plan on executors every micro-batch. It must be deterministic (the same events give the
  same rows: no ``current_timestamp()``, no ``rand()``), since a re-executed batch is skipped
  by its batch id, trusting it would have written the same rows.
* The events are a streaming DataFrame with one column per field of the processor's event
  types (the union of their reader schemas' fields, each nullable: a field another type lacks
  is null), Avro ``timestamp-millis`` as ``TimestampType``, decimals (``bytes`` or ``fixed``)
  as ``DecimalType``, plus ``event_type``, ``topic``, ``partition`` and ``offset`` (every Avro
  type's column type: :mod:`refold.processors.fold.avro_types`). Other event types on the
  topics are passed by undecoded.
* The returned DataFrame has a string ``key`` column and value columns. Each micro-batch's
  rows (in ``update`` mode: the groups that changed; in ``append`` mode: the rows that became
  final) are upserted as JSON into the generation's table, ``t:<table>:<key>``, in ONE Redis
  ``MULTI/EXEC`` with the source positions the batch reached and its batch id; a batch id at or
  below the stored one changes nothing. So the rows are written exactly once, in effect.
* Aggregation state (open windows, join buffers) lives in the generation's Spark checkpoint,
  not in Redis. A generation is therefore rebuilt only with a new checkpoint: ``replay
  --to-earliest`` (a new generation) works as for any processor; a lost checkpoint, a snapshot
  seed or Redis losing writes cannot be repaired in place and stop the processor with an
  operator action to rebuild.
* Lateness is Spark's: ``withWatermark`` holds one global watermark, moved at the end of each
  micro-batch, so which late records are dropped depends on batch boundaries (refold's own
  windows decide per partition in log order, identically in every replay).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from refold.contracts.errors import ContractError
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "META_COLUMNS",
    "OUTPUT_MODES",
    "Conversion",
    "DataFrameProcessor",
    "EventColumn",
    "EventColumnsError",
    "OutputMode",
    "event_columns",
    "event_row",
    "events_ddl",
    "is_dataframe_processor",
    "output_mode_of",
]

OutputMode = Literal["update", "append"]
OUTPUT_MODES: tuple[OutputMode, ...] = ("update", "append")
# Columns every event row has besides its fields: where it came from and what it is.
META_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_type", "STRING"),
    ("topic", "STRING"),
    ("partition", "INT"),
    ("offset", "BIGINT"),
)


class DataFrameProcessor(Protocol):
    """A processor that is a Spark DataFrame transformation (see the module docstring).

    Implementations must be picklable only as far as their ``transform`` builds Spark
    expressions (it runs on the driver); a Python UDF inside it is shipped to executors as
    any UDF is. Optionally, ``output_mode`` (``update``, the default, or ``append``: what
    stream-stream joins need, and windows written once when final).
    """

    @property
    def name(self) -> str:
        """Processor name (Redis keys, consumer group, dead-letter topic)."""
        ...

    @property
    def table(self) -> str:
        """The table its rows are upserted into, by their ``key``."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types decoded into the events DataFrame; others are passed by."""
        ...

    def transform(self, events: DataFrame) -> DataFrame:
        """The rows to upsert, from the streaming DataFrame of decoded events.

        Returns:
            A streaming DataFrame with a string ``key`` column and the value columns.
        """
        ...


def is_dataframe_processor(processor: object) -> bool:
    """True when ``processor`` is a :class:`DataFrameProcessor` (it has a ``transform``)."""
    return callable(getattr(processor, "transform", None))


def output_mode_of(processor: object) -> OutputMode:
    """The processor's Spark output mode (default ``update``).

    Raises:
        EventColumnsError: Not ``update`` or ``append`` (``complete`` would rewrite every
            row every batch).
    """
    mode = getattr(processor, "output_mode", "update")
    if mode not in OUTPUT_MODES:
        msg = (
            f"{getattr(processor, 'name', processor)!r}: output_mode must be update or append, "
            f"not {mode!r}"
        )
        raise EventColumnsError(msg)
    return cast("OutputMode", mode)


class EventColumnsError(ContractError):
    """The event types' schemas do not make one typed row (a clash or an unsupported type)."""

    code = "EVENT_COLUMNS"


@dataclass(frozen=True, slots=True)
class EventColumn:
    """One column of the events DataFrame: a field of one or more event types.

    Attributes:
        name: The field name.
        ddl: Its Spark SQL type (``TIMESTAMP``, ``ARRAY<STRUCT<...>>``...).
        conversion: From the decoded value to what Arrow takes (see :data:`Conversion`).
    """

    name: str
    ddl: str
    conversion: Conversion = None


_PRIMITIVES: dict[str, str] = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "string": "STRING",
}
# Spark has no time-of-day type: time-millis and time-micros stay the raw Avro numbers (see
# refold.processors.fold.avro_types); timestamps become microseconds, dates Python dates.
_LOGICAL: dict[LogicalType, tuple[str, Conversion]] = {
    "date": ("DATE", ("date",)),
    "time-millis": ("INT", None),
    "time-micros": ("BIGINT", None),
    "timestamp-millis": ("TIMESTAMP", ("ts_ms",)),
    "timestamp-micros": ("TIMESTAMP", None),
    "local-timestamp-millis": ("TIMESTAMP_NTZ", ("ts_ms",)),
    "local-timestamp-micros": ("TIMESTAMP_NTZ", None),
    "uuid": ("STRING", None),
}
# Spark's DecimalType holds at most 38 digits.
_SPARK_MAX_PRECISION = 38


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _SparkTypes:
    """Avro -> ``(Spark DDL type, conversion)``: the events DataFrame's emitter.

    An :class:`~refold.processors.fold.avro_types.AvroVisitor`; nullability is not kept (every
    column and nested field of the events DataFrame is nullable).
    """

    def error(self, message: str) -> EventColumnsError:
        return EventColumnsError(message)

    def primitive(self, name: Primitive, at: str) -> tuple[str, Conversion]:
        if name == "null":
            msg = f"{at}: the null type (a value that is always null) has no Spark column type"
            raise self.error(msg)
        return _PRIMITIVES[name], None

    def logical(self, kind: LogicalType, at: str) -> tuple[str, Conversion]:
        return _LOGICAL[kind]

    def decimal(self, precision: int, scale: int, at: str) -> tuple[str, Conversion]:
        if precision > _SPARK_MAX_PRECISION:
            msg = (
                f"{at}: decimal({precision}, {scale}) is wider than Spark's "
                f"{_SPARK_MAX_PRECISION} digits; a DataFrame processor cannot read this field"
            )
            raise self.error(msg)
        return f"DECIMAL({precision},{scale})", ("decimal", scale)

    def fixed(self, size: int) -> tuple[str, Conversion]:
        return "BINARY", None

    def enum(self, symbols: Sequence[str]) -> tuple[str, Conversion]:
        return "STRING", None

    def record(
        self, name: str, fields: Sequence[AvroField[tuple[str, Conversion]]]
    ) -> tuple[str, Conversion]:
        ddl = ", ".join(f"{_quote(f.name)}: {f.type[0]}" for f in fields)
        return f"STRUCT<{ddl}>", record_conversion([(f.name, f.type[1]) for f in fields])

    def array(self, items: Walked[tuple[str, Conversion]]) -> tuple[str, Conversion]:
        ddl, conversion = items.type
        return f"ARRAY<{ddl}>", array_conversion(conversion)

    def map(self, values: Walked[tuple[str, Conversion]]) -> tuple[str, Conversion]:
        ddl, conversion = values.type
        return f"MAP<STRING, {ddl}>", map_conversion(conversion)


def event_columns(schemas: Sequence[Mapping[str, Any]]) -> tuple[EventColumn, ...]:
    """The columns of the events DataFrame: the union of the records' fields, in order.

    Args:
        schemas: The reader schemas (Avro JSON) of the processor's event types, in order.

    Returns:
        One column per field name (first appearance first), then :data:`META_COLUMNS`.

    Raises:
        EventColumnsError: A field is of two different types in two event types, is named as
            a meta column, or has a type Spark cannot hold (a union of several types, the
            null type, a decimal of more than 38 digits: see
            :mod:`refold.processors.fold.avro_types`).
    """
    columns: dict[str, EventColumn] = {}
    for schema in schemas:
        where = str(schema.get("name", "?"))
        for field in AvroTypeWalker(_SparkTypes(), where).fields(schema):
            name, (ddl, conversion) = field.name, field.type
            column = EventColumn(name, ddl, conversion)
            seen = columns.setdefault(name, column)
            if seen != column:
                msg = (
                    f"field {name!r} is {seen.ddl} in one event type and {ddl} in "
                    f"{where}: a DataFrame processor's event types must agree on the "
                    "types of the fields they share"
                )
                raise EventColumnsError(msg)
    clash = sorted(set(columns) & {name for name, _ddl in META_COLUMNS})
    if clash:
        msg = f"event fields {', '.join(clash)} clash with the columns every event row has"
        raise EventColumnsError(msg)
    return (*columns.values(), *(EventColumn(n, t) for n, t in META_COLUMNS))


def events_ddl(columns: Sequence[EventColumn]) -> str:
    """The Spark DDL schema of the events DataFrame."""
    return ", ".join(f"{_quote(c.name)} {c.ddl}" for c in columns)


def event_row(
    columns: Sequence[EventColumn],
    event_type: str,
    event: Mapping[str, Any],
    origin: tuple[str, int, int],
) -> dict[str, Any]:
    """One decoded event as a row of the events DataFrame (Arrow-ready values).

    Args:
        columns: From :func:`event_columns`.
        event_type: Its type.
        event: Its fields, as decoded.
        origin: ``(topic, partition, offset)``.
    """
    topic, partition, offset = origin
    row = {c.name: convert(event.get(c.name), c.conversion) for c in columns}
    row.update(event_type=event_type, topic=topic, partition=partition, offset=offset)
    return row
