"""Each micro-batch's stats, counted in the generation's stats hash (driver side).

Every ``foreachBatch`` sink (fold, archive, DataFrame) ends its batch with
:meth:`BatchStatsRecorder.record`: one Lua call of
:class:`refold.contracts.store.stats.ProcessorStats` that counts the batch (its duration, the
watermark) once per checkpoint and batch id; what its records did was counted in the transactions
that applied them. The batch stats feed ``/metrics`` and the dashboard; they are best effort, so a
failure to write them is logged and never fails a batch.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import redis

from refold.contracts.store.connect import redis_client
from refold.contracts.store.stats import ProcessorStats
from refold.processors.runtime.checkpoints import checkpoint_files
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.window_store import generation_watermark

__all__ = ["BatchStatsRecorder", "checkpoint_id"]

logger = logging.getLogger(__name__)

# A stats write must not hold a batch up: a Redis that does not answer within this is skipped
# (the batch's own writes have their own, longer patience).
_SOCKET_TIMEOUT_S = 2.0


def checkpoint_id(checkpoint: str | Path | None) -> str:
    """The query id in a Spark checkpoint's ``metadata`` file ("" when there is none).

    Spark writes the file when a query first starts on the checkpoint and keeps it while the
    checkpoint lives, so a batch run again after a restart has the same id, and a new
    checkpoint (whose batch ids start at 0 again) a new one.
    """
    if checkpoint is None:
        return ""
    try:
        metadata = f"{checkpoint}/metadata"
        found = json.loads(checkpoint_files(metadata).read_text(metadata)).get("id", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return str(found)


class BatchStatsRecorder:
    """Counts a sink's micro-batches in its generation's stats hash.

    Driver side; picklable until first used (the Redis client is created lazily).

    Args:
        target: The generation.
        checkpoint: The query's checkpoint directory (its id scopes the batch ids); None
            when unknown (tests), which scopes them to the stats hash as a whole.
    """

    def __init__(self, target: FoldTarget, checkpoint: str | Path | None = None) -> None:
        self.target = target
        self.checkpoint = checkpoint
        self._redis: redis.Redis | None = None
        self._stats: ProcessorStats | None = None
        self._checkpoint_id: str | None = None

    def _store(self) -> ProcessorStats:
        if self._stats is None:
            self._redis = redis_client(
                self.target.redis_url,
                socket_timeout=_SOCKET_TIMEOUT_S,
                socket_connect_timeout=_SOCKET_TIMEOUT_S,
            )
            self._stats = ProcessorStats(self._redis, self.target.layout)
        return self._stats

    def _scope(self) -> str:
        if not self._checkpoint_id:  # read again until Spark has written it
            self._checkpoint_id = checkpoint_id(self.checkpoint)
        return self._checkpoint_id

    def _watermark(self, store: ProcessorStats) -> int | None:
        event_time = self.target.event_time
        if event_time is None:
            return None
        return generation_watermark(store.client, self.target.keys, event_time.lateness_ms)

    def record(self, batch_id: int, started: float) -> None:
        """Count batch ``batch_id``: its duration and the watermark (never raises).

        What its records did was counted in the transactions that applied them
        (:func:`refold.contracts.store.stats.count_outcome`); a failure here is logged as a warning.

        Args:
            batch_id: Spark's batch id.
            started: ``time.perf_counter()`` when ``foreachBatch`` began.
        """
        duration_ms = (time.perf_counter() - started) * 1000
        try:
            store = self._store()
            store.record_batch(
                self.target.generation,
                batch_id,
                0,
                0,
                0,
                {},
                duration_ms,
                self._watermark(store),
                checkpoint_id=self._scope(),
                now_ms=int(time.time() * 1000),
            )
        except Exception as exc:  # best effort: stats never fail the batch they describe
            logger.warning(
                "could not record the stats of batch %d: %s",
                batch_id,
                exc,
                extra={
                    "batch_id": batch_id,
                    "generation": self.target.generation,
                    "processor": self.target.processor,
                },
            )
