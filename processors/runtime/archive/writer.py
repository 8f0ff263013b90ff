"""The archive task's Redis side: its per-worker writer and the guarded commit of positions.

Executor side. :class:`ArchiveWriter` holds what a Python worker keeps between tasks (Spark
reuses workers): the Redis client, the dead-letter producer and the Parquet tables; its
:meth:`~ArchiveWriter.commit` moves a task's positions in one transaction guarded by ``WATCH``
(:func:`~refold.processors.runtime.watched_commit.commit_watched`; step 6 of
:mod:`refold.processors.runtime.archive.sink`, which runs the task).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import redis
from confluent_kafka import Producer
from redis.typing import EncodableT, FieldT

from refold.contracts.kafka.outputs import output_producer
from refold.contracts.layout import BATCH_ID_FIELD
from refold.contracts.store.connect import redis_client
from refold.contracts.store.outage import wait_out_redis
from refold.contracts.store.stats import count_outcome
from refold.processors.errors import SinkConflictError, StateStoreUnavailableError
from refold.processors.fold.archive import ArchiveProcessor, ArchiveTable
from refold.processors.runtime.envelope import FoldTarget
from refold.processors.runtime.watched_commit import commit_watched

if TYPE_CHECKING:
    from redis.client import Pipeline

    from refold.processors.runtime.archive.sink import ArchiveOutcome, ArchivePlan

__all__ = ["ArchiveWriter", "redis_call", "writer_of"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def redis_call(target: FoldTarget, client: redis.Redis, call: Callable[[], _T]) -> _T:
    """Run ``call``, waiting out an unreachable Redis (:func:`wait_out_redis`)."""

    def give_up(waited: float, exc: Exception) -> StateStoreUnavailableError:
        return StateStoreUnavailableError(
            f"{target.processor} g{target.generation}: Redis unreachable for {waited:.0f}s "
            f"({exc}); the batch's positions did not move and nothing is lost. Operator "
            "action: bring Redis back; a restart archives the batch."
        )

    return wait_out_redis(call, f"the archive processor {target.processor}", client, give_up)


class ArchiveWriter:
    """Per Python worker (Spark reuses them): the Redis client, the producer, the tables."""

    def __init__(self, plan: ArchivePlan) -> None:
        self.plan = plan
        self.redis = redis_client(plan.target.redis_url)
        self.producer: Producer = output_producer(dict(plan.target.kafka))
        self._tables: dict[str, ArchiveTable] = {}

    def table(self, event_type: str) -> ArchiveTable:
        """The Parquet table of an event type (made once per worker)."""
        table = self._tables.get(event_type)
        if table is None:
            reader = self.plan.codec.reader_for(event_type)
            table = self.plan.archive.table(reader.raw, reader.fingerprint_hex)
            self._tables[event_type] = table
        return table

    def applied(self, fields: list[str]) -> dict[str, int]:
        """The generation's applied positions of ``fields``, waiting out a Redis outage."""
        applied = self.plan.target.positions(self.redis)
        return redis_call(self.plan.target, self.redis, lambda: applied.read_fields(fields))

    def commit(
        self,
        moves: Mapping[str, tuple[int | None, int]],
        batch_id: int,
        outcome: ArchiveOutcome | None = None,
        letters: Mapping[str, str] | None = None,
    ) -> None:
        """Move each position from its expected value to its end, in one guarded transaction.

        ``outcome``'s counts (archived, dead letters) are counted in the same transaction, and
        ``letters`` (the dead-letter index's entries it decided) written.

        Raises:
            SinkConflictError: A position is neither where this task found it nor at its end
                (another writer archives the same generation), or kept changing.
        """
        target = self.plan.target
        keys = target.keys
        applied = target.positions(self.redis)
        fields = sorted(moves)

        def attempt(pipe: Pipeline) -> None:
            found = applied.read_fields(fields, via=pipe)
            now = {f: found.get(f) for f in fields}
            if all(now[f] == end for f, (_exp, end) in moves.items()):
                return  # an attempt with the same plan committed these very files
            moved = [f for f, (expected, _end) in moves.items() if now[f] != expected]
            if moved:
                msg = (
                    f"{target.processor} g{target.generation}: positions {', '.join(moved)} "
                    f"moved while batch {batch_id} was archived: another process writes this "
                    "generation. Operator action: make sure only one archive processor runs it."
                )
                raise SinkConflictError(msg)
            pipe.multi()
            pipe.hset(
                applied.writer_key(),
                mapping={**{f: end for f, (_e, end) in moves.items()}, BATCH_ID_FIELD: batch_id},
            )
            for name, (_expected, end) in moves.items():
                pipe.set(keys.guard(name), end)
            if letters:
                index: dict[FieldT, EncodableT] = dict(letters.items())
                pipe.hset(keys.dead_letters, mapping=index)
            if outcome is not None:
                count_outcome(
                    pipe, keys.stats, events=outcome.archived, dead_letters=outcome.dead_letters
                )
            pipe.execute()

        commit_watched(
            self.redis,
            [keys.guard(f) for f in fields],
            attempt,
            f"{target.processor} g{target.generation}",
            {"batch_id": batch_id},
        )


# One writer per plan per Python worker.
_WRITERS: dict[tuple[FoldTarget, ArchiveProcessor], ArchiveWriter] = {}


def writer_of(plan: ArchivePlan) -> ArchiveWriter:
    """The writer of ``plan`` in this Python worker (made on first use)."""
    key = (plan.target, plan.archive)
    writer = _WRITERS.get(key)
    if writer is None:
        writer = _WRITERS[key] = ArchiveWriter(plan)
    return writer
