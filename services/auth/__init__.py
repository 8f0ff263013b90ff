"""API keys with scopes (ingest, query, admin), stored hashed in Redis.

- :func:`require` is the FastAPI dependency every protected route declares:
  ``dependencies=[Depends(require("query"))]``.
- :class:`ApiKeyStore` adds, lists, revokes and verifies keys (``refold keys`` drives it).
"""

from __future__ import annotations

from refold.services.auth.dependencies import require
from refold.services.auth.keys import SCOPES, ApiKey, ApiKeyStore, Scope

__all__ = ["SCOPES", "ApiKey", "ApiKeyStore", "Scope", "require"]
