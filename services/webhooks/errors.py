"""Errors of the webhook dispatcher (under :class:`~refold.contracts.errors.RefoldError`)."""

from __future__ import annotations

from refold.services.errors import ServiceError

__all__ = [
    "WebhookConfigError",
    "WebhookDeadLetterError",
    "WebhookError",
    "WebhookLeaseError",
    "WebhookStoreError",
]


class WebhookError(ServiceError):
    """Base of the webhook dispatcher's errors."""

    code = "WEBHOOK_ERROR"


class WebhookConfigError(WebhookError):
    """A setting is missing, malformed or contradictory; the dispatcher does not start."""

    code = "WEBHOOK_CONFIG_INVALID"


class WebhookLeaseError(WebhookError):
    """Another live dispatcher of the same name (and role) runs, or this one lost its lease."""

    code = "WEBHOOK_LEASE_HELD"


class WebhookDeadLetterError(WebhookError):
    """Failed insights could not be written to the dead-letter topic; nothing after them moved.

    The dispatcher stops without advancing its positions, so a restart delivers (or dead-letters)
    the same insights again: nothing is lost.
    """

    code = "WEBHOOK_DEAD_LETTER_FAILED"
    retriable = True


class WebhookStoreError(WebhookError):
    """Redis did not take the dispatcher's positions and delivery log in time."""

    code = "WEBHOOK_STORE_UNAVAILABLE"
    retriable = True
