"""Errors of the replay tool."""

from __future__ import annotations

from contracts.errors import RefoldError

__all__ = ["PlanError", "RebuildError", "ReplayError"]


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
