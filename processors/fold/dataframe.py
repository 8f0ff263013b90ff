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
  is null), Avro ``timestamp-millis`` as ``TimestampType``, plus ``event_type``, ``topic``,
  ``partition`` and ``offset``. Other event types on the topics are passed by undecoded.
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

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from refold.contracts.errors import ContractError

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


# How a decoded Avro value (fastavro, logical types off: see refold.contracts.catalog) becomes the
# Python value Arrow builds the Spark column from. None: as it is. Otherwise a tuple, first the
# kind: ("ts_ms",) epoch ms -> us; ("date",) days -> date; ("decimal", scale) big-endian bytes ->
# Decimal; ("array", item); ("map", value); ("record", ((field, conversion), ...)). Plain tuples,
# so a decode plan pickles without closures.
Conversion = tuple[Any, ...] | None


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


_PRIMITIVES = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "string": "STRING",
}
_EPOCH_DAY = dt.date(1970, 1, 1)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _Types:
    """Avro -> Spark types for one schema, remembering its named types (records, enums, fixed)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.named: dict[str, tuple[str, Conversion]] = {}

    def _fail(self, what: str) -> EventColumnsError:
        return EventColumnsError(f"{self.where}: {what}")

    def _remember(
        self, schema: Mapping[str, Any], namespace: str, value: tuple[str, Conversion]
    ) -> None:
        name = str(schema["name"])
        space = str(schema.get("namespace", namespace))
        self.named[name.rsplit(".", 1)[-1]] = value
        self.named[name if "." in name or not space else f"{space}.{name}"] = value

    def of(self, schema: Any, namespace: str = "") -> tuple[str, Conversion]:
        """``(Spark DDL type, conversion)`` of an Avro type."""
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema], None
            known = self.named.get(schema) or self.named.get(f"{namespace}.{schema}")
            if known is None:
                msg = f"type {schema!r} has no Spark column type"
                raise self._fail(msg)
            return known
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            if len(branches) != 1:
                msg = (
                    f"the union {schema!r} has no Spark column type (only a type or null is "
                    "supported)"
                )
                raise self._fail(msg)
            return self.of(branches[0], namespace)
        if not isinstance(schema, Mapping):
            msg = f"unexpected Avro type {schema!r}"
            raise self._fail(msg)
        kind, logical = schema.get("type"), schema.get("logicalType")
        if logical == "timestamp-millis" and kind == "long":
            return "TIMESTAMP", ("ts_ms",)
        if logical == "timestamp-micros" and kind == "long":
            return "TIMESTAMP", None
        if logical == "local-timestamp-millis" and kind == "long":
            return "TIMESTAMP_NTZ", ("ts_ms",)
        if logical == "local-timestamp-micros" and kind == "long":
            return "TIMESTAMP_NTZ", None
        if logical == "date" and kind == "int":
            return "DATE", ("date",)
        if logical == "decimal" and kind == "bytes":
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if precision > 38:
                msg = f"decimal({precision}) is wider than Spark's 38 digits"
                raise self._fail(msg)
            return f"DECIMAL({precision},{scale})", ("decimal", scale)
        if kind == "record":
            space = str(schema.get("namespace", namespace))
            fields = [(f["name"], self.of(f["type"], space)) for f in schema["fields"]]
            ddl = ", ".join(f"{_quote(n)}: {t}" for n, (t, _c) in fields)
            conversions = tuple((n, c) for n, (_t, c) in fields)
            value: tuple[str, Conversion] = (
                f"STRUCT<{ddl}>",
                ("record", conversions) if any(c for _n, c in conversions) else None,
            )
            self._remember(schema, namespace, value)
            return value
        if kind == "enum":
            self._remember(schema, namespace, ("STRING", None))
            return "STRING", None
        if kind == "fixed":
            self._remember(schema, namespace, ("BINARY", None))
            return "BINARY", None
        if kind == "array":
            item, conversion = self.of(schema["items"], namespace)
            return f"ARRAY<{item}>", None if conversion is None else ("array", conversion)
        if kind == "map":
            item, conversion = self.of(schema["values"], namespace)
            return f"MAP<STRING, {item}>", None if conversion is None else ("map", conversion)
        if isinstance(kind, str | list | Mapping):  # a primitive written as {"type": "long"}
            return self.of(kind, namespace)
        msg = f"unexpected Avro type {schema!r}"
        raise self._fail(msg)


def event_columns(schemas: Sequence[Mapping[str, Any]]) -> tuple[EventColumn, ...]:
    """The columns of the events DataFrame: the union of the records' fields, in order.

    Args:
        schemas: The reader schemas (Avro JSON) of the processor's event types, in order.

    Returns:
        One column per field name (first appearance first), then :data:`META_COLUMNS`.

    Raises:
        EventColumnsError: A field is of two different types in two event types, is named as
            a meta column, or has a type Spark cannot hold (a union of several types).
    """
    columns: dict[str, EventColumn] = {}
    for schema in schemas:
        types = _Types(str(schema.get("name", "?")))
        space = str(schema.get("namespace", ""))
        for field in schema["fields"]:
            name = str(field["name"])
            ddl, conversion = types.of(field["type"], space)
            column = EventColumn(name, ddl, conversion)
            seen = columns.setdefault(name, column)
            if seen != column:
                msg = (
                    f"field {name!r} is {seen.ddl} in one event type and {ddl} in "
                    f"{types.where}: a DataFrame processor's event types must agree on the "
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


def _convert(value: Any, conversion: Conversion) -> Any:
    if value is None or conversion is None:
        return value
    kind = conversion[0]
    if kind == "ts_ms":
        return int(value) * 1000
    if kind == "date":
        return _EPOCH_DAY + dt.timedelta(days=int(value))
    if kind == "decimal":
        return Decimal(int.from_bytes(value, "big", signed=True)).scaleb(-conversion[1])
    if kind == "array":
        return [_convert(v, conversion[1]) for v in value]
    if kind == "map":
        return {k: _convert(v, conversion[1]) for k, v in value.items()}
    fields = conversion[1]  # record
    return {**value, **{n: _convert(value.get(n), c) for n, c in fields if c is not None}}


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
    row = {c.name: _convert(event.get(c.name), c.conversion) for c in columns}
    row.update(event_type=event_type, topic=topic, partition=partition, offset=offset)
    return row
