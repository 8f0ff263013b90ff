"""Errors of the processors layer."""

from __future__ import annotations

from contracts.errors import RefoldError

__all__ = ["DeadLetterError", "ProcessorConfigError", "ProcessorError", "SinkConflictError"]


class ProcessorError(RefoldError):
    """Base of the processors' errors."""

    code = "PROCESSOR_ERROR"


class SinkConflictError(ProcessorError):
    """Another writer kept changing the same generation's positions (a zombie task?)."""

    code = "SINK_CONFLICT"
    retriable = True


class DeadLetterError(ProcessorError):
    """A dead-letter record was not acknowledged; the batch is not applied (nothing is lost)."""

    code = "DEAD_LETTER_FAILED"
    retriable = True


class ProcessorConfigError(ProcessorError):
    """The processor cannot start with these settings."""

    code = "PROCESSOR_CONFIG"
