"""The one walk over an Avro schema that typed columns are built from (pure: no Spark, no Arrow).

Two emitters turn Avro field types into column types: the events DataFrame of a DataFrame
processor (Spark DDL, :mod:`refold.processors.fold.dataframe`) and the archive's Parquet tables
(Arrow, :mod:`refold.processors.fold.archive`). Both are an :class:`AvroVisitor` walked by
:class:`AvroTypeWalker`, which owns what Avro itself decides, once:

* **Named types**: a record, enum or fixed (a fixed decimal too) is remembered under its short
  and its full name (``namespace.name``; a name with a dot is already full), and a later
  reference by either name gives the same column type without visiting it again. A reference
  to a type not defined before it (a recursive record too) is refused.
* **Unions**: ``["null", T]`` (either order) is ``T``, nullable; ``"null"`` and ``["null"]``
  are the null type, nullable. A union of several non-null types is refused (a column holds
  one type), and so is a union directly inside a union (Avro forbids it).
* **Logical types**: ``decimal`` on ``bytes`` *and* on ``fixed``; ``date``; ``time-millis`` and
  ``time-micros``; ``timestamp-millis``/``-micros`` and their ``local-`` forms; ``uuid``. A
  logical type on another base type is ignored, as the Avro specification says: the base type
  is used.

What each emitter makes of them, decided once for both (issue 21):

* **A fixed decimal is a decimal in both** (Spark ``DECIMAL(p,s)``, Arrow ``decimal128``),
  converted like a bytes decimal. The codec decodes with logical types off
  (:mod:`refold.contracts.catalog`), so both arrive as big-endian two's-complement bytes;
  Spark used to show a fixed decimal as those raw ``BINARY`` bytes.
* **Above 38 digits**: Arrow widens to ``decimal256``; Spark has no wider decimal, so the events
  DataFrame refuses the field, naming it.
* **time-millis / time-micros**: Arrow ``time32[ms]`` / ``time64[us]``. Spark has no time of
  day type: ``INT`` milliseconds / ``BIGINT`` microseconds after midnight, the raw Avro value
  (what a Python fold sees too).
* **The null type**: Arrow ``null``; Spark refuses it (a column that can only be null).
* ``uuid`` is a string in both; ``date`` is Spark ``DATE`` / Arrow ``date32``.

:func:`convert` is the one conversion of decoded values the emitters' :data:`Conversion` plans
describe.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, get_args

__all__ = [
    "LOGICAL_TYPES",
    "AvroField",
    "AvroTypeWalker",
    "AvroVisitor",
    "Conversion",
    "LogicalType",
    "Primitive",
    "Walked",
    "array_conversion",
    "convert",
    "map_conversion",
    "record_conversion",
]

T = TypeVar("T")

Primitive = Literal["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
_PRIMITIVES: frozenset[str] = frozenset(get_args(Primitive))

LogicalType = Literal[
    "date",
    "time-millis",
    "time-micros",
    "timestamp-millis",
    "timestamp-micros",
    "local-timestamp-millis",
    "local-timestamp-micros",
    "uuid",
]
# The logical types the walker resolves (decimal aside), each with the one base type it is valid
# on; on any other base type the logical type is ignored (the Avro specification's rule).
LOGICAL_TYPES: Mapping[str, str] = {
    "date": "int",
    "time-millis": "int",
    "time-micros": "long",
    "timestamp-millis": "long",
    "timestamp-micros": "long",
    "local-timestamp-millis": "long",
    "local-timestamp-micros": "long",
    "uuid": "string",
}

# How a decoded Avro value (fastavro, logical types off: see refold.contracts.catalog) becomes
# what a column takes. None: as it is. Otherwise a tuple, first the kind: ("ts_ms",) epoch ms ->
# us; ("date",) days -> date; ("decimal", scale) big-endian two's-complement bytes (of a bytes or
# a fixed decimal) -> Decimal; ("array", item); ("map", value); ("record", ((field,
# conversion), ...)). Plain tuples, so a decode plan or a table pickles into Spark tasks without
# closures.
Conversion = tuple[Any, ...] | None

_EPOCH_DAY = dt.date(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class Walked(Generic[T]):
    """An Avro type as an emitter typed it.

    Attributes:
        type: What the visitor returned for it.
        nullable: A union with null, or the null type itself.
    """

    type: T
    nullable: bool


@dataclass(frozen=True, slots=True)
class AvroField(Generic[T]):
    """One field of a record, as an emitter typed it.

    Attributes:
        name: The field name.
        type: What the visitor returned for the field's type.
        nullable: The field's type is a union with null (or the null type).
    """

    name: str
    type: T
    nullable: bool


class AvroVisitor(Protocol[T]):
    """An emitter: what one Avro type becomes, given what its parts became.

    Methods are called bottom-up, once per type written out in the schema (a named type used
    again is not visited again). ``at`` says where the type is (``Record.field``, ``[]`` for
    array items, ``{}`` for map values), for an error message. A method refuses a type by
    raising what :meth:`error` makes.
    """

    def error(self, message: str) -> Exception:
        """The exception this emitter raises for a type it or the walker refuses."""
        ...

    def primitive(self, name: Primitive, at: str) -> T:
        """A primitive type (``"null"`` included)."""
        ...

    def logical(self, kind: LogicalType, at: str) -> T:
        """A logical type on its valid base type (see :data:`LOGICAL_TYPES`)."""
        ...

    def decimal(self, precision: int, scale: int, at: str) -> T:
        """A ``decimal`` on ``bytes`` or on ``fixed`` (the value is the unscaled integer)."""
        ...

    def fixed(self, size: int) -> T:
        """A ``fixed`` of ``size`` bytes (not a decimal)."""
        ...

    def enum(self, symbols: Sequence[str]) -> T:
        """An ``enum`` (decoded as its symbol, a string)."""
        ...

    def record(self, name: str, fields: Sequence[AvroField[T]]) -> T:
        """A nested ``record`` (its short name), from its fields in order."""
        ...

    def array(self, items: Walked[T]) -> T:
        """An ``array`` of ``items``."""
        ...

    def map(self, values: Walked[T]) -> T:
        """A ``map`` from strings to ``values``."""
        ...


class AvroTypeWalker(Generic[T]):
    """Walks the Avro types of one schema into a visitor, remembering its named types.

    One walker per top-level schema: a named type defined by one field can be used by a later
    field. Not thread-safe (the names are remembered as it walks); cheap to make.

    Args:
        visitor: The emitter.
        where: The schema's name, the start of every error message.
    """

    def __init__(self, visitor: AvroVisitor[T], where: str) -> None:
        self.visitor = visitor
        self.where = where
        self.named: dict[str, T] = {}

    def fields(self, record: Mapping[str, Any]) -> list[AvroField[T]]:
        """The fields of a top-level record, each typed (the record itself is not visited).

        Raises:
            Exception: What the visitor's ``error`` makes, for a type it cannot hold.
        """
        space = str(record.get("namespace", ""))
        return self._fields(record, space, self.where)

    def walk(self, schema: Any, namespace: str = "", at: str | None = None) -> Walked[T]:
        """One Avro type (a union resolved to its type and whether it is nullable).

        Args:
            schema: The Avro type (JSON: a name, a union list or a type object).
            namespace: The enclosing namespace, for names without one.
            at: Where it is, for error messages (default: the walker's ``where``).

        Raises:
            Exception: What the visitor's ``error`` makes, for a type it cannot hold.
        """
        at = self.where if at is None else at
        if not isinstance(schema, list):
            typed = self._one(schema, namespace, at)
            return Walked(typed, schema == "null" or schema == {"type": "null"})
        branches = [b for b in schema if b != "null"]
        if len(branches) > 1:
            msg = (
                f"{at}: the union {schema!r} has several non-null types; a column holds one "
                "type, optionally with null"
            )
            raise self.visitor.error(msg)
        if not branches:
            return Walked(self.visitor.primitive("null", at), True)
        return Walked(self._one(branches[0], namespace, at), len(branches) < len(schema))

    def _fields(self, record: Mapping[str, Any], space: str, at: str) -> list[AvroField[T]]:
        out = []
        for field in record["fields"]:
            name = str(field["name"])
            walked = self.walk(field["type"], space, f"{at}.{name}")
            out.append(AvroField(name, walked.type, walked.nullable))
        return out

    def _remember(self, schema: Mapping[str, Any], namespace: str, value: T) -> None:
        name = str(schema["name"])
        space = str(schema.get("namespace", namespace))
        self.named[name.rsplit(".", 1)[-1]] = value
        self.named[name if "." in name or not space else f"{space}.{name}"] = value

    def _one(self, schema: Any, namespace: str, at: str) -> T:
        """A type that is not a union."""
        visit = self.visitor
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return visit.primitive(cast("Primitive", schema), at)
            known = self.named.get(schema)
            if known is None:
                known = self.named.get(f"{namespace}.{schema}")
            if known is None:
                msg = f"{at}: type {schema!r} is not defined before its use"
                raise visit.error(msg)
            return known
        if isinstance(schema, list):
            msg = f"{at}: a union directly inside a union: {schema!r}"
            raise visit.error(msg)
        if not isinstance(schema, Mapping):
            msg = f"{at}: unexpected Avro type {schema!r}"
            raise visit.error(msg)
        kind, logical = schema.get("type"), schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            value = visit.decimal(precision, scale, at)
            if kind == "fixed":
                self._remember(schema, namespace, value)
            return value
        if isinstance(logical, str) and LOGICAL_TYPES.get(logical) == kind:
            return visit.logical(cast("LogicalType", logical), at)
        if kind == "record":
            space = str(schema.get("namespace", namespace))
            fields = self._fields(schema, space, at)
            value = visit.record(str(schema["name"]).rsplit(".", 1)[-1], fields)
            self._remember(schema, namespace, value)
            return value
        if kind == "enum":
            value = visit.enum([str(s) for s in schema.get("symbols", ())])
            self._remember(schema, namespace, value)
            return value
        if kind == "fixed":
            value = visit.fixed(int(schema["size"]))
            self._remember(schema, namespace, value)
            return value
        if kind == "array":
            return visit.array(self.walk(schema["items"], namespace, f"{at}[]"))
        if kind == "map":
            return visit.map(self.walk(schema["values"], namespace, f"{at}{{}}"))
        if isinstance(kind, str | Mapping):  # a primitive or a name written as {"type": "long"}
            return self._one(kind, namespace, at)
        msg = f"{at}: unexpected Avro type {schema!r}"
        raise visit.error(msg)


def array_conversion(items: Conversion) -> Conversion:
    """The conversion of an array whose items convert by ``items`` (None: nothing to do)."""
    return None if items is None else ("array", items)


def map_conversion(values: Conversion) -> Conversion:
    """The conversion of a map whose values convert by ``values`` (None: nothing to do)."""
    return None if values is None else ("map", values)


def record_conversion(fields: Sequence[tuple[str, Conversion]]) -> Conversion:
    """The conversion of a record from its fields' (None: no field needs one)."""
    needed = tuple((name, c) for name, c in fields if c is not None)
    return ("record", needed) if needed else None


def convert(value: Any, conversion: Conversion) -> Any:
    """A decoded Avro value as a column takes it (see :data:`Conversion`).

    A decimal already decoded as a :class:`~decimal.Decimal` (fastavro with logical types on)
    is passed through.
    """
    if value is None or conversion is None:
        return value
    kind = conversion[0]
    if kind == "ts_ms":
        return int(value) * 1000
    if kind == "date":
        return _EPOCH_DAY + dt.timedelta(days=int(value))
    if kind == "decimal":
        if isinstance(value, Decimal):
            return value
        return Decimal(int.from_bytes(value, "big", signed=True)).scaleb(-conversion[1])
    if kind == "array":
        return [convert(v, conversion[1]) for v in value]
    if kind == "map":
        return {k: convert(v, conversion[1]) for k, v in value.items()}
    fields = conversion[1]  # record
    return {**value, **{name: convert(value.get(name), c) for name, c in fields}}
