"""Settings of the replay tool (environment: ``REFOLD_*``, shared with the processors)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.settings import KafkaSettings, RedisSettings, SparkSettings

__all__ = ["ReplaySettings"]


class ReplaySettings(BaseSettings):
    """Where the stack is; read once in ``__main__``."""

    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    # Passed on to the rebuild's processor (the process contract).
    spark: SparkSettings = Field(default_factory=SparkSettings)
    state_dir: Path = Path(".state")
    # Cut over when the shadow generation is this many records behind the log end or less.
    lag_threshold: int = 0
    # Give up a rebuild that has not caught up after this long (readers stay where they are).
    replay_timeout_s: float = 3600.0
