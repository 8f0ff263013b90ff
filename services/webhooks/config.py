"""Settings of a webhook dispatcher: where to deliver, what to read, how hard to try.

Built in ``deploy/webhooks_cli.py`` (``refold webhooks``) from ``REFOLD_WEBHOOKS__*`` and the
command line, or by a caller in Python; inner classes take them explicitly.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.settings import StackSettings

__all__ = [
    "DEFAULT_NAME",
    "StartAt",
    "WebhookServiceSettings",
    "WebhookSettings",
    "dlq_topic",
    "mirror_group",
]

DEFAULT_NAME = "webhooks"
StartAt = Literal["earliest", "end"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# Headers the dispatcher sets itself; a configured header of these names would break a guarantee.
_RESERVED = frozenset(
    {
        "content-type",
        "content-length",
        "host",
        "idempotency-key",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def dlq_topic(name: str) -> str:
    """The dead-letter topic of the dispatcher ``name``: ``<name>.webhook-dlq``."""
    return f"{name}.webhook-dlq"


def mirror_group(name: str, role: str, key_prefix: str) -> str:
    """The consumer group holding the copy of a dispatcher's positions (never joined).

    ``refold-webhooks.<name>.<role>`` under the default key prefix and
    ``refold-webhooks.<key prefix>.<name>.<role>`` under any other: two deployments that share
    a Kafka cluster keep their own copies, so a dispatcher whose Redis holds no positions yet
    never resumes from the other deployment's (skipping what only the other delivered).
    """
    if key_prefix == DEFAULT_KEY_PREFIX:
        return f"refold-webhooks.{name}.{role}"
    return f"refold-webhooks.{key_prefix}.{name}.{role}"


class WebhookSettings(BaseModel):
    """One dispatcher: a set of insight topics delivered to one URL.

    Attributes:
        name: Names the dispatcher's Redis keys (positions, log, counters, lease) and its
            dead-letter topic ``<name>.webhook-dlq``. One running process per name.
        url: The receiver's URL (``https://`` in production; ``http://`` is for loopback).
        topics: The insight topics to deliver (``<processor>.insights``); ``redrive`` reads
            the dead-letter topic instead and needs none.
        start: Where a topic without a stored position starts: its first record, or its end
            when the dispatcher first starts (then stored, so a restart misses nothing).
        severities: Deliver records whose ``severity`` field is one of these (an ``Insight``'s:
            pattern processors mark what webhooks push as ``critical``); others are skipped
            (counted, not logged). Records without the field are always delivered. Empty:
            every record.
        concurrency: Deliveries in flight at a time (threads, one keep-alive connection each).
        batch_size: Records taken per poll, and settled records per commit at most (commits
            also happen every 0.5 s and whenever nothing is in progress).
        max_uncommitted: Records read and not committed yet, at most: a crash re-delivers at
            most these. A partition's position only moves past settled records, so one insight
            retrying holds the commits of its partition, not the deliveries behind it.
        max_attempts: Attempts per insight before it is dead-lettered (``webhook-failed``).
        backoff_initial_s: Backoff before the 2nd attempt is between half this and this.
        backoff_max_s: Cap of the backoff window (before jitter halves it at most).
        timeout_s: Whole-request timeout (connect, write, read) of one attempt.
        connect_timeout_s: Connect timeout of one attempt (a dead host fails fast).
        headers: Extra request headers, e.g. ``Authorization`` (secrets; never logged).
        signing_secret: When set, every request is signed as Standard Webhooks do
            (``webhook-id``, ``webhook-timestamp``, ``webhook-signature: v1,<HMAC-SHA256>``).
            A ``whsec_`` prefix means the rest is the base64 key, as in that spec.
        ca_bundle: CA certificates to verify the receiver with (default: the system's).
        client_cert: Client certificate (PEM) for mutual TLS; ``client_key`` if separate.
        client_key: The client certificate's key (PEM).
        log_max_entries: Approximate cap of the delivery log stream (``XADD MAXLEN ~``).
        poll_timeout_s: Longest wait for new records per poll.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = DEFAULT_NAME
    url: str
    topics: tuple[str, ...] = ()
    start: StartAt = "earliest"
    severities: tuple[str, ...] = ("critical",)
    concurrency: int = Field(default=8, ge=1, le=256)
    batch_size: int = Field(default=200, ge=1, le=10_000)
    max_uncommitted: int = Field(default=1000, ge=1, le=100_000)
    max_attempts: int = Field(default=12, ge=1, le=100)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=120.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    signing_secret: SecretStr | None = None
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    log_max_entries: int = Field(default=100_000, ge=100)
    poll_timeout_s: float = Field(default=0.5, gt=0, le=10)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            msg = f"name {value!r}: use letters, digits, '.', '_' or '-' (up to 100)"
            raise ValueError(msg)
        return value

    @field_validator("url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            msg = f"url {value!r} is not a URL: {exc}"
            raise ValueError(msg) from exc
        if url.scheme not in ("http", "https") or not url.host:
            msg = f"url {value!r}: an http:// or https:// URL with a host is needed"
            raise ValueError(msg)
        return value

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        reserved = sorted(h for h in value if h.lower() in _RESERVED)
        if reserved:
            msg = f"headers {', '.join(reserved)} are set by the dispatcher and cannot be given"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WebhookSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            msg = (
                f"backoff_max_s ({self.backoff_max_s}) is below backoff_initial_s "
                f"({self.backoff_initial_s})"
            )
            raise ValueError(msg)
        if self.connect_timeout_s > self.timeout_s:
            msg = (
                f"connect_timeout_s ({self.connect_timeout_s}) exceeds timeout_s ({self.timeout_s})"
            )
            raise ValueError(msg)
        if self.client_key is not None and self.client_cert is None:
            msg = "client_key is given without client_cert"
            raise ValueError(msg)
        if len(set(self.topics)) != len(self.topics):
            msg = f"topics are named twice: {', '.join(self.topics)}"
            raise ValueError(msg)
        if dlq_topic(self.name) in self.topics:
            msg = f"{dlq_topic(self.name)} is this dispatcher's own dead-letter topic (use redrive)"
            raise ValueError(msg)
        return self

    @property
    def dlq_topic(self) -> str:
        """This dispatcher's dead-letter topic."""
        return dlq_topic(self.name)

    @property
    def is_loopback(self) -> bool:
        """True when the receiver is on this machine (plain http is then acceptable)."""
        return httpx.URL(self.url).host in ("127.0.0.1", "localhost", "::1")

    def tls_context(self) -> ssl.SSLContext | bool:
        """What httpx verifies the receiver with: the system's CAs, or a configured context."""
        if self.ca_bundle is None and self.client_cert is None:
            return True
        context = ssl.create_default_context(
            cafile=None if self.ca_bundle is None else str(self.ca_bundle)
        )
        if self.client_cert is not None:
            context.load_cert_chain(
                str(self.client_cert), None if self.client_key is None else str(self.client_key)
            )
        return context


class WebhookServiceSettings(StackSettings):
    """The stack (``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``) and ``REFOLD_WEBHOOKS__*`` defaults.

    ``webhooks`` holds whatever ``REFOLD_WEBHOOKS__<FIELD>`` variables are set (e.g.
    ``REFOLD_WEBHOOKS__URL``, ``REFOLD_WEBHOOKS__SIGNING_SECRET``,
    ``REFOLD_WEBHOOKS__HEADERS='{"Authorization": "Bearer ..."}'``); the command line overrides
    them, and :class:`WebhookSettings` validates the result once.
    """

    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    webhooks: dict[str, object] = Field(default_factory=dict)
