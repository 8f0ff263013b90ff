"""Errors of the services layer (producer SDK, reader)."""

from __future__ import annotations

from contracts.errors import RefoldError

__all__ = ["NoLiveGenerationError", "PublishError", "ServiceError"]


class ServiceError(RefoldError):
    """Base of the services' errors."""

    code = "SERVICE_ERROR"


class PublishError(ServiceError):
    """The broker did not acknowledge one or more events (nothing is reported as sent)."""

    code = "PUBLISH_FAILED"
    retriable = True


class NoLiveGenerationError(ServiceError):
    """A reader asked for a processor that has no live generation yet."""

    code = "NO_LIVE_GENERATION"
