"""Settings of the replay tool (environment: ``REFOLD_*``, shared with the processors)."""

from __future__ import annotations

from refold.contracts.settings import StackSettings

__all__ = ["ReplaySettings"]


class ReplaySettings(StackSettings):
    """Where the stack is, and replay's own knobs; read once in ``__main__``.

    The Spark settings are passed on to the rebuild's processor (the process contract).
    """

    # Cut over when the shadow generation is this many records behind the log end or less.
    lag_threshold: int = 0
    # Give up a rebuild that has not caught up after this long (readers stay where they are).
    replay_timeout_s: float = 3600.0
