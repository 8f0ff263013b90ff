"""Errors of the processors layer."""

from __future__ import annotations

from refold.contracts.errors import RefoldError
from refold.contracts.store.outage import REDIS_UNAVAILABLE  # re-exported: its old home

__all__ = [
    "REDIS_UNAVAILABLE",
    "CodeChangedError",
    "ProcessorConfigError",
    "ProcessorError",
    "SinkConflictError",
    "StateStoreUnavailableError",
]


class ProcessorError(RefoldError):
    """Base of the processors' errors."""

    code = "PROCESSOR_ERROR"


class SinkConflictError(ProcessorError):
    """Another writer kept changing the same generation's positions (a zombie task?)."""

    code = "SINK_CONFLICT"
    retriable = True


class ProcessorConfigError(ProcessorError):
    """The processor cannot start with these settings."""

    code = "PROCESSOR_CONFIG"


class StateStoreUnavailableError(ProcessorError):
    """Redis stayed unreachable longer than the sink waits; nothing of the batch was lost.

    The batch's positions did not move, so a restarted processor applies it again.
    """

    code = "STATE_STORE_UNAVAILABLE"
    retriable = True


class CodeChangedError(ProcessorConfigError):
    """A generation would be written by other code than the code that built it.

    Raised on every path to a generation (start, restart, following a cutover, a Spark worker
    that loaded an edited file); ``--accept-code-change`` is the operator's explicit way past it.
    """

    code = "CODE_CHANGED"
