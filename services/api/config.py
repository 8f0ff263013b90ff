"""Settings of ``refold serve``: ``REFOLD_SERVE__*`` on top of the stack's blocks.

Built once in ``deploy/serve_cli.py`` (the only reader of the environment) or by a caller in
Python (tests, a user's own ASGI wiring); everything below takes them explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from refold.contracts.settings import StackSettings
from refold.services.api.rate_limits import parse_rate

__all__ = ["AuthMode", "HttpSettings", "ServeSettings"]

AuthMode = Literal["keys", "off"]
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class HttpSettings(BaseModel):
    """How the HTTP services listen and behave.

    Attributes:
        host: Interface to bind (``0.0.0.0`` behind a load balancer).
        port: TCP port.
        workers: uvicorn worker processes (the services keep no state of their own: any
            number of them, on any number of hosts, serve the same answers).
        auth: ``keys``: every data endpoint needs an API key with the right scope (see
            ``refold keys``); ``off``: no authentication (development only).
        ingest_timeout_s: How long an ingest request waits for the broker's acknowledgements
            before it answers 503.
        consistency_timeout_s: The longest a query waits for its consistency token (a request
            asks for less with ``wait_ms``).
        default_wait_ms: The wait of a query with a token and no ``wait_ms``.
        page_size: Default page size of a scan; ``max_page_size`` its upper bound.
        max_batch_keys: Most keys one batch get may ask for.
        max_ingest_events: Most events one ingest request may carry.
        max_request_bytes: Largest request body, on every route (413 ``REQUEST_TOO_LARGE``
            before anything parses it). 4 MiB holds 10,000 events of ~400 bytes as JSON.
        max_reported_errors: Refused events an ingest answer describes in full; the rest are
            counted (``errors_omitted``).
        idempotency_horizon_s: How long ingest remembers an ``Idempotency-Key`` and what its
            request produced (a retry within it is answered, not produced again).
        ingest_rate_limit: Requests one API key may make to ingest routes, e.g.
            ``100/second`` or ``5000 per minute`` (429 ``RATE_LIMITED`` over it; ``""``: none).
        query_rate_limit: The same for query routes.
        stall_after_s: ``/health`` reports a processor as stalled when records wait on one of
            its partitions and its position there has not moved for this long.
        ssl_certfile: TLS certificate (PEM) to serve HTTPS directly; usually TLS ends at a
            load balancer or reverse proxy instead (docs/serving.md).
        ssl_keyfile: Its private key.
        topics: Topics to publish to instead of the contract sets' own, by name (JSON), e.g.
            ``REFOLD_SERVE__TOPICS='{"commerce.orders": "staging.orders"}'`` (as a
            processor's ``REFOLD_<P>__TOPICS`` renames what it reads).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)
    auth: AuthMode = "keys"
    ingest_timeout_s: float = Field(default=10.0, gt=0)
    consistency_timeout_s: float = Field(default=10.0, ge=0)
    default_wait_ms: int = Field(default=5_000, ge=0)
    page_size: int = Field(default=100, ge=1)
    max_page_size: int = Field(default=1_000, ge=1)
    max_batch_keys: int = Field(default=1_000, ge=1)
    max_ingest_events: int = Field(default=10_000, ge=1)
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_reported_errors: int = Field(default=100, ge=1)
    idempotency_horizon_s: float = Field(default=24 * 3600.0, gt=0)
    ingest_rate_limit: str = "1000/second"
    query_rate_limit: str = "10000/second"
    stall_after_s: float = Field(default=60.0, gt=0)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    topics: dict[str, str] = Field(default_factory=dict)

    @field_validator("ingest_rate_limit", "query_rate_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_rate(value)  # a ValueError says what the limits library reads
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HttpSettings:
        if self.page_size > self.max_page_size:
            msg = f"page_size {self.page_size} is above max_page_size {self.max_page_size}"
            raise ValueError(msg)
        if self.auth == "off" and self.host not in _LOOPBACK:
            msg = (
                f"auth 'off' serves every route, replay execute included, to anyone: it is "
                f"refused on host {self.host!r}; use it on 127.0.0.1 only, or make keys "
                "(`refold keys add`)"
            )
            raise ValueError(msg)
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            msg = "ssl_certfile and ssl_keyfile go together"
            raise ValueError(msg)
        return self


class ServeSettings(StackSettings):
    """The stack's settings and ``REFOLD_SERVE__*`` (e.g. ``REFOLD_SERVE__PORT=8080``)."""

    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    serve: HttpSettings = Field(default_factory=HttpSettings)
