"""Errors of API key management (``refold keys``, :class:`~.keys.ApiKeyStore`).

A request with a missing, wrong or insufficient key is not an error of this tree: the HTTP
dependency answers it with 401 or 403 (:func:`refold.services.auth.require`).
"""

from __future__ import annotations

from refold.services.errors import ServiceError

__all__ = [
    "ApiKeyError",
    "ApiKeyNameTakenError",
    "ApiKeySpecError",
    "ApiKeyStoreError",
    "UnknownApiKeyError",
]


class ApiKeyError(ServiceError):
    """Base of the API key errors."""

    code = "API_KEY_ERROR"


class ApiKeySpecError(ApiKeyError):
    """A key to add has an invalid name, scope or expiry."""

    code = "API_KEY_INVALID"


class ApiKeyNameTakenError(ApiKeyError):
    """A key to add has the name of a key that is not revoked (names pick keys to revoke)."""

    code = "API_KEY_NAME_TAKEN"


class UnknownApiKeyError(ApiKeyError):
    """No unrevoked key has this id or name."""

    code = "API_KEY_UNKNOWN"


class ApiKeyStoreError(ApiKeyError):
    """Redis could not be read or written, or holds a record this version cannot read."""

    code = "API_KEY_STORE_FAILED"
    # Redis may be back on the next try (a restart, a failover).
    retriable = True
