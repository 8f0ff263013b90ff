"""Avro records in two framings, one codec (docs/schema-registry.md).

* **single-object encoding** (the default, no server): ``C3 01`` + the 8-byte little-endian
  CRC-64-AVRO fingerprint of the writer schema + body;
* **registry framing** (the Confluent wire format): ``00`` + the writer schema's id in a schema
  registry, 4 bytes big-endian + body. The id is mapped once to its schema's fingerprint
  through the registry (:class:`~refold.contracts.schema_registry.RegistrySchemas`), then both
  framings take the same path.

The fingerprint names the writer schema in :class:`~refold.contracts.catalog.SchemaCatalog`;
decoding resolves it to the reader's schema (by default the newest version of the same record), so
every record ever written stays readable by today's code. Decoding reads either framing; which
one a producer writes is its topic's (:attr:`~refold.contracts.topics.TopicSpec.framing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO
from typing import Any, cast

import fastavro
from fastavro.validation import ValidationError, validate

from refold.contracts.catalog import SchemaCatalog, SchemaVersion, default_catalog
from refold.contracts.errors import DeserializationError, EventValidationError, UnknownSchemaError
from refold.contracts.schema_registry import (
    REGISTRY,
    SINGLE_OBJECT,
    Framing,
    RegistrySchemas,
    SchemaRegistrySettings,
)

__all__ = [
    "MAGIC",
    "REGISTRY_MAGIC",
    "DecodedEvent",
    "EventCodec",
    "fingerprint_of",
    "framing_of",
    "writer_key",
]

MAGIC = b"\xc3\x01"
REGISTRY_MAGIC = b"\x00"
_HEADER_LEN = len(MAGIC) + 8
_REGISTRY_HEADER_LEN = len(REGISTRY_MAGIC) + 4


def fingerprint_of(value: bytes | None) -> bytes | None:
    """The writer schema's fingerprint in a record's single-object header, without decoding.

    Args:
        value: A record's value, as read from Kafka.

    Returns:
        The 8 fingerprint bytes after :data:`MAGIC`, or ``None`` when ``value`` is not single-object
        encoded (``None``, shorter than the 10-byte header, or another magic).
    """
    if value is None or len(value) < _HEADER_LEN or value[:2] != MAGIC:
        return None
    return value[2:_HEADER_LEN]


def writer_key(value: bytes | None) -> bytes | None:
    """The header bytes that name a record's writer schema, in either framing, without decoding.

    Returns:
        The 8-byte fingerprint (single-object encoding), or the 5 bytes ``00`` + schema id
        (registry framing): keys of different lengths, so one cache serves both; ``None`` when
        ``value`` is in neither framing.
    """
    if value is None:
        return None
    if len(value) >= _HEADER_LEN and value[:2] == MAGIC:
        return value[2:_HEADER_LEN]
    if len(value) >= _REGISTRY_HEADER_LEN and value[:1] == REGISTRY_MAGIC:
        return value[:_REGISTRY_HEADER_LEN]
    return None


def framing_of(value: bytes | None) -> Framing | None:
    """A record's framing, read off its first bytes (``None``: neither)."""
    key = writer_key(value)
    if key is None:
        return None
    return SINGLE_OBJECT if len(key) == _HEADER_LEN - 2 else REGISTRY


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    """A decoded record: its event type, the writer schema it came with, and its fields."""

    event_type: str
    writer: SchemaVersion
    data: dict[str, Any]


class EventCodec:
    """Validate, encode and decode events of the catalog's record types.

    Picklable (the catalog and per-fingerprint caches, so it travels in a plan pickled into
    Spark tasks; each task's copy fills its own caches) and safe to share between threads.

    Args:
        catalog: The schema catalog; default the installed contract sets' schemas.
        readers: Reader schema per event type, when not the newest version (a processor pins
            the versions its code understands).
        registry: The schema registry of registry-framed records: its settings, or a
            :class:`~refold.contracts.schema_registry.RegistrySchemas` to share; default the
            settings ``REFOLD_SCHEMA_REGISTRY__*`` (none set: registry-framed records are
            refused, naming the setting). Nothing is asked of it until such a record shows up.
    """

    def __init__(
        self,
        catalog: SchemaCatalog | None = None,
        readers: dict[str, SchemaVersion] | None = None,
        registry: SchemaRegistrySettings | RegistrySchemas | None = None,
    ) -> None:
        self.catalog = catalog or default_catalog()
        self._readers = dict(readers or {})
        if not isinstance(registry, RegistrySchemas):
            registry = RegistrySchemas(registry or SchemaRegistrySettings.from_env())
        self.registry = registry
        # writer key (writer_key) -> (writer, parsed reader schema or None when it is the writer)
        self._plans: dict[bytes, tuple[SchemaVersion, Any]] = {}
        self._fields: dict[str, frozenset[str]] = {}  # event type -> its declared fields

    def reader_for(self, event_type: str) -> SchemaVersion:
        """The schema version decoded records of ``event_type`` are resolved to."""
        reader = self._readers.get(event_type)
        if reader is None:
            reader = self._readers[event_type] = self.catalog.latest(event_type)
        return reader

    def writer_of(self, value: bytes | None) -> SchemaVersion | None:
        """The writer schema named by a record's header, without decoding its body.

        For skipping records of types a reader does not want before paying for a decode. Cached
        per fingerprint with :meth:`decode`'s plans, so each fingerprint is looked up once.

        Args:
            value: A record's value, as read from Kafka.

        Returns:
            The writer schema, or ``None`` when ``value`` is in neither framing or its writer is
            not in the catalog (or unknown to the registry): :meth:`decode` refuses such a
            record, saying why.

        Raises:
            SchemaRegistryUnavailableError: A registry-framed record's id is not cached and the
                registry did not answer (the record is not skipped).
        """
        key = writer_key(value)
        if key is None:
            return None
        plan = self._plans.get(key)
        if plan is None:
            try:
                plan = self._plan(key)
            except DeserializationError:
                return None  # not cached: rare, and decode reports it per record anyway
        return plan[0]

    def writer_for_key(self, key: bytes) -> SchemaVersion:
        """The writer schema a :func:`writer_key` names (cached with :meth:`decode`'s plans).

        Raises:
            DeserializationError: Unknown fingerprint or schema id, or no registry configured.
            SchemaRegistryUnavailableError: See :meth:`writer_of`.
        """
        plan = self._plans.get(key)
        return (plan or self._plan(key))[0]

    def validate(self, event_type: str, data: dict[str, Any]) -> SchemaVersion:
        """Check ``data`` against the newest ``event_type`` schema.

        Returns:
            The schema version the event will be written with.

        Raises:
            UnknownEventTypeError: No such event type.
            EventValidationError: A field is missing, unknown, or of the wrong type; the message
                names each wrong field.
        """
        schema = self.catalog.latest(event_type)
        declared = {f["name"] for f in schema.raw["fields"]}
        problems = [
            f"{event_type}.{name} is not a field of {event_type}"
            for name in data
            if name not in declared
        ]
        try:
            validate(data, schema.parsed, raise_errors=True)
        except ValidationError as exc:
            # fastavro stops at a record's first wrong field: check each field on its own so
            # that the message names every one (only for a refused event: no cost otherwise).
            problems.extend(_field_problems(schema, data) or [str(p) for p in exc.errors])
        if problems:
            raise EventValidationError(event_type, problems)
        return schema

    def encode(
        self,
        event_type: str,
        data: dict[str, Any],
        *,
        validated: bool = False,
        framing: Framing = SINGLE_OBJECT,
    ) -> bytes:
        """Encode one event with the newest schema of its type.

        Args:
            event_type: Record name, e.g. ``OrderPlaced``.
            data: The event's fields.
            validated: Skip validation (the caller just ran :meth:`validate`).
            framing: Single-object encoding (the default) or registry framing (the schema's
                id is looked up in the registry once per version).

        Raises:
            EventValidationError: See :meth:`validate`.
            SchemaNotRegisteredError: Registry framing, and the version is not registered
                (the message says to run ``refold contracts publish``).
        """
        schema = self.catalog.latest(event_type) if validated else self.validate(event_type, data)
        out = BytesIO()
        out.write(self.header(schema, framing))
        fastavro.schemaless_writer(out, schema.parsed, data)
        return out.getvalue()

    def header(self, schema: SchemaVersion, framing: Framing = SINGLE_OBJECT) -> bytes:
        """The bytes before the body of a record written with ``schema`` in ``framing``.

        Raises:
            SchemaNotRegisteredError: See :meth:`encode`.
        """
        if framing == SINGLE_OBJECT:
            return MAGIC + schema.fingerprint
        return REGISTRY_MAGIC + self.registry.id_of(schema).to_bytes(4, "big")

    def encode_checked(
        self, event_type: str, data: dict[str, Any], framing: Framing = SINGLE_OBJECT
    ) -> bytes:
        """:meth:`encode`, checked by the writer instead of by a validation pass first.

        fastavro's writer refuses a missing field, a wrong type or an out-of-range number
        (naming the field); unknown fields are checked here. Only a refused event is then
        validated, for the message that names every wrong field. ~4x cheaper than
        :meth:`encode` on a valid event: for outputs written in bulk (a processor's side
        effects), where the validation's cost would be paid per record.

        Raises:
            EventValidationError: As :meth:`encode`.
        """
        schema = self.catalog.latest(event_type)
        declared = self._fields.get(event_type)
        if declared is None:
            declared = self._fields[event_type] = frozenset(f["name"] for f in schema.raw["fields"])
        try:
            if not declared.issuperset(data):
                msg = f"unknown fields {sorted(set(data) - declared)}"
                raise ValueError(msg)  # caught below: validated for the full message
            out = BytesIO()
            out.write(self.header(schema, framing))
            fastavro.schemaless_writer(out, schema.parsed, data)
            return out.getvalue()
        except (TypeError, ValueError, OverflowError) as exc:
            self.validate(event_type, data)  # raises, naming every wrong field
            raise EventValidationError(event_type, [str(exc)]) from exc

    def decode(self, payload: bytes | None) -> DecodedEvent:
        """Decode one record and resolve it to the reader schema of its type.

        Raises:
            DeserializationError: In neither framing, unknown fingerprint or schema id, or a
                body that does not match its writer schema. ``raw`` holds the payload.
            SchemaRegistryUnavailableError: A registry-framed record whose id is not cached,
                and the registry did not answer (never a dead letter: nothing is skipped).
        """
        if payload is not None and len(payload) >= _HEADER_LEN and payload[:2] == MAGIC:
            key, start = payload[2:_HEADER_LEN], _HEADER_LEN
        elif (
            payload is not None
            and len(payload) >= _REGISTRY_HEADER_LEN
            and payload[:1] == REGISTRY_MAGIC
        ):
            key, start = payload[:_REGISTRY_HEADER_LEN], _REGISTRY_HEADER_LEN
        else:
            head = b"" if payload is None else payload[:_HEADER_LEN]
            reason = "bad-magic"
            detail = (
                "neither Avro single-object encoded nor registry framed (starts with "
                f"{head.hex() or 'nothing'})"
            )
            raise DeserializationError(reason, detail, payload)
        plan = self._plans.get(key)
        if plan is None:
            try:
                plan = self._plan(key)
            except DeserializationError as exc:
                exc.raw = payload
                raise
        writer, reader_schema = plan
        body = BytesIO(payload)  # shares the bytes (no copy); skip the header by seeking
        body.seek(start)
        try:
            data = fastavro.schemaless_reader(body, writer.parsed, reader_schema)
        except Exception as exc:  # fastavro raises many kinds on corrupt bytes
            reason = "bad-body"
            detail = f"{writer.name} v{writer.version} body does not decode: {exc!r}"
            raise DeserializationError(reason, detail, payload) from exc
        if body.tell() != len(payload):
            # fastavro stops at the end of the datum; bytes after it mean the body is not what
            # the fingerprint says (e.g. another record's body under this fingerprint).
            reason = "bad-body"
            extra = len(payload) - body.tell()
            detail = f"{writer.name} v{writer.version} body has {extra} bytes after the record"
            raise DeserializationError(reason, detail, payload)
        return DecodedEvent(writer.name, writer, cast("dict[str, Any]", data))

    def _plan(self, key: bytes) -> tuple[SchemaVersion, Any]:
        """Look up and cache how to decode records of one writer key (see :func:`writer_key`).

        Raises:
            UnknownSchemaError: No schema in the catalog has this fingerprint, or the registry's
                schema of this id is no version in the catalog.
            DeserializationError: The registry has no such id, or none is configured.
        """
        if len(key) == _REGISTRY_HEADER_LEN:
            schema_id = int.from_bytes(key[1:], "big")
            fingerprint = self.registry.fingerprint_of_id(schema_id)
            try:
                writer = self.catalog.by_fingerprint(fingerprint)
            except UnknownSchemaError:
                reason = "unknown-schema-id"
                detail = (
                    f"schema id {schema_id} in the registry (fingerprint {fingerprint.hex()}) "
                    "is no locked version of any contract"
                )
                raise UnknownSchemaError(reason, detail) from None
        else:
            writer = self.catalog.by_fingerprint(key)
        reader = self.reader_for(writer.name)
        plan = self._plans[key] = (writer, None if reader is writer else reader.parsed)
        return plan


def _field_problems(schema: SchemaVersion, data: dict[str, Any]) -> list[str]:
    """One line per field of ``data`` that breaks ``schema`` (missing or of a wrong type)."""
    parsed = schema.parsed
    name = str(parsed["name"])
    named = dict(parsed.get("__named_schemas", {}))
    problems = []
    for field in parsed["fields"]:
        if field["name"] not in data and "default" in field:
            continue
        if field["name"] not in data:
            problems.append(f"{name}.{field['name']} is missing (it has no default)")
            continue
        alone = fastavro.parse_schema(
            {"type": "record", "name": f"{name}__{field['name']}", "fields": [field]},
            named_schemas=dict(named),
        )
        try:
            validate({field["name"]: data[field["name"]]}, alone, raise_errors=True)
        except ValidationError as exc:
            problems.extend(
                str(p).replace(f"{name}__{field['name']}.", f"{name}.") for p in exc.errors
            )
    return problems
