"""The error root of refold and the contract-level errors.

Every refold error carries a stable ``code`` for alerting and says whether retrying can help.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ContractError",
    "DeserializationError",
    "EventTooLargeError",
    "EventValidationError",
    "RefoldError",
    "SchemaIncompatibleError",
    "SchemaLockError",
    "SchemaUnlockedError",
    "UnknownEventTypeError",
    "UnknownSchemaError",
]


class RefoldError(Exception):
    """Root of every error refold raises on purpose."""

    code: ClassVar[str] = "REFOLD_ERROR"
    retriable: ClassVar[bool] = False

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"


class ContractError(RefoldError):
    """An event, a schema or a record does not meet its contract."""

    code = "CONTRACT_ERROR"


class EventValidationError(ContractError):
    """An event does not match its Avro contract; nothing was sent.

    Attributes:
        event_type: The record name the event claimed to be.
        problems: One line per wrong field, each naming the field.
    """

    code = "EVENT_INVALID"

    def __init__(self, event_type: str, problems: list[str]) -> None:
        self.event_type = event_type
        self.problems = problems
        super().__init__(f"invalid {event_type}: " + "; ".join(problems))


class EventTooLargeError(ContractError):
    """An event is larger, encoded, than a Kafka message may be; nothing was sent."""

    code = "EVENT_TOO_LARGE"


class UnknownEventTypeError(ContractError):
    """No schema in the catalog has this record name."""

    code = "EVENT_TYPE_UNKNOWN"


class SchemaIncompatibleError(ContractError):
    """A schema version cannot read the records written with an older version."""

    code = "SCHEMA_INCOMPATIBLE"


class SchemaLockError(ContractError):
    """A published schema version was changed or deleted, or a ``contracts.lock`` is malformed."""

    code = "SCHEMA_LOCK_VIOLATED"


class SchemaUnlockedError(ContractError):
    """The producer SDK refuses a schema version that is not in its contract set's lock."""

    code = "SCHEMA_UNLOCKED"


class DeserializationError(ContractError):
    """A record's bytes cannot be decoded; it belongs in the dead-letter topic.

    Attributes:
        reason: Short machine-friendly reason (``bad-magic``, ``unknown-fingerprint``, ...).
        raw: The undecodable bytes, kept for the dead-letter record.
    """

    code = "RECORD_UNDECODABLE"

    def __init__(self, reason: str, detail: str, raw: bytes | None = None) -> None:
        self.reason = reason
        self.raw = raw
        super().__init__(f"{reason}: {detail}")


class UnknownSchemaError(DeserializationError):
    """The record's fingerprint matches no schema version in the catalog."""

    code = "SCHEMA_UNKNOWN"
