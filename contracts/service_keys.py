"""The Redis keys of the services: webhook dispatchers, API keys, HTTP ingest.

None of them is a processor's state: replay, snapshots and gc never touch them. Each has a hash
tag of its own, apart from every processor's keys. A processor generation's keys are in
:mod:`refold.contracts.layout`.

=========================================  ======  =============================================
``<p>:{webhooks.<name>}:...``               (any)   a webhook dispatcher's (``WebhookKeys``)
``<p>:{auth}:api_keys``                     hash    API key id -> JSON record: name, scopes,
                                                    SHA-256 of the key, created, expires and
                                                    revoked at (``ApiKeyKeys``)
=========================================  ======  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass

from refold.contracts.layout import DEFAULT_KEY_PREFIX

__all__ = ["ApiKeyKeys", "IngestKeys", "WebhookKeys"]


@dataclass(frozen=True, slots=True)
class WebhookKeys:
    """The keys of one webhook dispatcher (``refold.services.webhooks``), by its name.

    They share the hash tag ``{webhooks.<name>}``, so the dispatcher's commit (positions, log
    entries and counters in one Lua call) also works on a Redis Cluster. None of them is a
    processor's state: replay, snapshots and gc never touch them.

    =========================================  ======  =========================================
    key                                         type    content
    =========================================  ======  =========================================
    ``<p>:{webhooks.<name>}:positions``         hash    ``<topic>/<partition>`` -> next offset to
                                                        deliver (insight topics, and the DLQ's
                                                        for ``redrive``)
    ``<p>:{webhooks.<name>}:log``               stream  one entry per delivery outcome and per
                                                        retried attempt (capped, ``MAXLEN ~``)
    ``<p>:{webhooks.<name>}:counters``          hash    ``delivered``, ``retried``, ``failed``,
                                                        ``failed:<reason>``, ``redriven``
    ``<p>:{webhooks.<name>}:lease:<role>``      string  ``host:pid:nonce`` of the running
                                                        dispatcher (role ``dispatch``/``redrive``)
    =========================================  ======  =========================================
    """

    name: str
    prefix: str = DEFAULT_KEY_PREFIX

    @property
    def base(self) -> str:
        """Common prefix, with the cluster hash tag."""
        return f"{self.prefix}:{{webhooks.{self.name}}}"

    @property
    def positions(self) -> str:
        """Hash of the next offset to deliver per ``<topic>/<partition>``."""
        return f"{self.base}:positions"

    @property
    def log(self) -> str:
        """Stream of delivery outcomes (the delivery log)."""
        return f"{self.base}:log"

    @property
    def counters(self) -> str:
        """Hash of delivery counters (integers)."""
        return f"{self.base}:counters"

    def lease(self, role: str) -> str:
        """The lease of the dispatcher running ``role`` (one process per name and role)."""
        return f"{self.base}:lease:{role}"

    @staticmethod
    def pattern(prefix: str = DEFAULT_KEY_PREFIX) -> str:
        """SCAN pattern matching every dispatcher's counters hash (to list dispatchers)."""
        return f"{prefix}:{{webhooks.*}}:counters"

    @staticmethod
    def name_of(key: str, prefix: str = DEFAULT_KEY_PREFIX) -> str | None:
        """The dispatcher whose counters hash ``key`` is (inverse of :attr:`counters`)."""
        head, tail = f"{prefix}:{{webhooks.", "}:counters"
        if not (key.startswith(head) and key.endswith(tail)):
            return None
        name = key[len(head) : -len(tail)]
        return name or None


@dataclass(frozen=True, slots=True)
class ApiKeyKeys:
    """The keys of the HTTP services' API keys (``refold.services.auth``).

    One hash for every key, so that every replica of the services sees an added or revoked key
    on its next request, and one WATCH covers the name check of ``refold keys add``. Its hash
    tag ``{auth}`` keeps it apart from any processor's keys.
    """

    prefix: str = DEFAULT_KEY_PREFIX

    @property
    def registry(self) -> str:
        """Hash of every API key: key id -> JSON record (never the key itself, its SHA-256)."""
        return f"{self.prefix}:{{auth}}:api_keys"


@dataclass(frozen=True, slots=True)
class IngestKeys:
    """The keys of HTTP ingest (``refold.services.ingest``): one per idempotency key in use.

    Scoped by the caller's API key id (``-`` with authentication off), so two clients never
    share a key by accident; the client's key is hashed into the name (it may be any text up
    to 255 characters). The hash tag ``{ingest}`` keeps them apart from any processor's keys.
    """

    prefix: str = DEFAULT_KEY_PREFIX

    def idempotency(self, caller: str, key_sha256: str) -> str:
        """The record of one idempotency key of ``caller`` (its SHA-256, hex)."""
        return f"{self.prefix}:{{ingest}}:idempotency:{caller}:{key_sha256}"
