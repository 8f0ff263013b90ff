"""The optimistic commit every engine writes a generation through: WATCH, read, MULTI, EXEC.

The fold writer (:mod:`.envelope`), a DataFrame processor's driver (:mod:`.dataframe`) and
the archive's tasks (:mod:`.archive.writer`) each move a generation's positions together with
what they write, in one Redis transaction that ``WATCH``es the keys another writer of the same
positions would change (the partitions' guard keys, or the positions themselves). What each
reads and writes between ``WATCH`` and ``EXEC`` is its own; :func:`commit_watched` owns the
rest: a fresh pipeline per attempt, reading everything again after a ``WatchError``, and the
refusal once the keys kept changing (a second process writes the generation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from refold.processors.errors import SinkConflictError

if TYPE_CHECKING:
    from redis.client import Pipeline

__all__ = ["WATCH_ATTEMPTS", "commit_watched"]

logger = logging.getLogger(__name__)

# WATCH conflicts only happen with a concurrent writer of the same generation: a few are a
# transient overlap (a task retried while its first attempt still commits), more mean two
# processes write one generation.
WATCH_ATTEMPTS = 5

_T = TypeVar("_T")


def commit_watched(
    client: redis.Redis,
    watch: Sequence[str],
    attempt: Callable[[Pipeline], _T],
    who: str,
    extra: Mapping[str, Any] | None = None,
) -> _T:
    """``attempt(pipe)`` with ``watch`` WATCHed, again after each ``WatchError``.

    ``attempt`` reads through ``pipe`` (immediate mode), then either returns without
    ``MULTI`` (nothing to write: ``UNWATCH`` is sent for it) or calls ``pipe.multi()``, queues
    its writes and ``pipe.execute()``; a ``WatchError`` from that ``EXEC`` runs it again on a
    new pipeline, reading everything again.

    Args:
        client: The generation's Redis client.
        watch: The keys another writer of these positions would change.
        attempt: One try of the transaction; its result is returned.
        who: The generation, for the log and the refusal (``"order_state g3"``).
        extra: Fields of the warning logged at each conflict (e.g. the batch id).

    Raises:
        SinkConflictError: The watched keys changed :data:`WATCH_ATTEMPTS` times.
    """
    for _attempt in range(WATCH_ATTEMPTS):
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(*watch)  # type: ignore[no-untyped-call]
                return attempt(pipe)
            except redis.WatchError:
                logger.warning(
                    "%s: positions changed during the commit; reading them again",
                    who,
                    extra=dict(extra or {}),
                )
    msg = (
        f"{who}: positions changed {WATCH_ATTEMPTS} times during one commit: another process "
        "writes this generation. Operator action: make sure only one processor runs per "
        "generation."
    )
    raise SinkConflictError(msg)
