"""Errors of the replay tool."""

from __future__ import annotations

from refold.contracts.errors import RefoldError

__all__ = ["PlanError", "RebuildError", "ReplayError", "ReplayInterruptedError"]


class ReplayError(RefoldError):
    """Base of replay's errors."""

    code = "REPLAY_ERROR"


class PlanError(ReplayError):
    """The requested replay cannot be planned (unknown topic, partition, processor...)."""

    code = "REPLAY_PLAN_INVALID"


class RebuildError(ReplayError):
    """The shadow generation's processor failed; readers stay on the live generation."""

    code = "REPLAY_REBUILD_FAILED"
    retriable = True


class ReplayInterruptedError(ReplayError):
    """SIGTERM or SIGINT stopped a replay, which stopped what it had started first.

    Attributes:
        signal_number: The signal received (``signal.SIGTERM`` or ``signal.SIGINT``).
        exit_code: ``128 + signal_number`` (143 for SIGTERM, 130 for SIGINT): the shell's
            convention for a command ended by a signal, which the ``replay`` CLI exits with.
    """

    code = "REPLAY_INTERRUPTED"
    retriable = True

    def __init__(self, msg: str, signal_number: int) -> None:
        self.signal_number = signal_number
        self.exit_code = 128 + signal_number
        super().__init__(msg)
