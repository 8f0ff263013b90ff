"""Settings blocks shared by every deployable (each composes them in its own ``config.py``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contracts.layout import DEFAULT_KEY_PREFIX

__all__ = ["KafkaSettings", "RedisSettings"]


class KafkaSettings(BaseModel):
    """Where the Kafka cluster is, and extra librdkafka properties.

    Attributes:
        bootstrap_servers: Comma-separated ``host:port`` list.
        client_properties: Extra librdkafka properties (security, timeouts, ...), applied last.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:19092"
    client_properties: dict[str, str] = Field(default_factory=dict)

    def as_librdkafka(self) -> dict[str, str]:
        """The one translation point to librdkafka configuration."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_properties}


class RedisSettings(BaseModel):
    """Where Redis is, and the key prefix of refold's keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = "redis://127.0.0.1:16379/0"
    key_prefix: str = DEFAULT_KEY_PREFIX
