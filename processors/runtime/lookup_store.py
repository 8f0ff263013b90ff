"""Stream-table joins on the driver: pending events meet the table's rows as of their time.

A lookup processor's tasks add each on-time event to the generation's pending set (scored by its
event time), with the positions. After each micro-batch, :class:`LookupJoiner` (a
:class:`~refold.processors.runtime.background.DriverTask`) takes the pending events strictly below
the table processor's watermark, reads their rows from the table's live generation, asks the fold
for the increments, and applies them with one Lua call that removes each pending event and adds its
increments atomically: an event is joined exactly once, even if a round is repeated. An event the
fold fails on goes to the dead-letter topic (acknowledged first) and is removed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import cast

import orjson
import redis
from confluent_kafka import Producer

from refold.contracts.kafka.outputs import Deliveries, output_producer
from refold.contracts.layout import StateLayout
from refold.contracts.processors import EventTime
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.lookups import PENDING_TIMERS, LookupFold, Pending, decode_pending
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.dead_letters import DeadLetter, produce_letters
from refold.processors.runtime.window_store import generation_watermark

__all__ = ["LookupJoiner"]

logger = logging.getLogger(__name__)

_CHUNK = 2_000  # pending events joined per round trip
# KEYS[1]: pending set, KEYS[2]: aggregate hash. ARGV per event: member, n, then n pairs of
# (counter, amount). Increments apply only when this call removed the member.
_JOIN = """
local i, joined = 1, 0
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    joined = joined + 1
    for j = 0, n - 1 do
      redis.call('HINCRBY', KEYS[2], ARGV[i + 2 + 2 * j], ARGV[i + 3 + 2 * j])
    end
  end
  i = i + 2 + 2 * n
end
return joined
"""


class LookupJoiner(DriverTask):
    """Joins a lookup processor's pending events once the table's watermark has passed them.

    Its rounds also run while its processor is idle (:attr:`idle_rounds`): the table's
    watermark moves with the table processor's batches, not with this processor's.

    Args:
        layout: The lookup processor's keys.
        generation: Its generation.
        fold: The lookup processor.
        event_time: Its event-time settings (which field holds each event's time).
        table_lateness_ms: The table processor's allowed lateness (its watermark is its
            clocks' minimum minus that).
        redis_url: Redis.
        kafka: librdkafka settings (dead letters).
        dlq_topic: The lookup processor's dead-letter topic.
    """

    def __init__(
        self,
        layout: StateLayout,
        generation: int,
        fold: LookupFold,
        event_time: EventTime,
        table_lateness_ms: int,
        redis_url: str,
        kafka: Mapping[str, str],
        dlq_topic: str,
    ) -> None:
        super().__init__()
        self.idle_rounds = True
        self.layout = layout
        self.keys = layout.generation(generation)
        self.fold = fold
        self.event_time = event_time
        self.table_lateness_ms = table_lateness_ms
        self.redis_url = redis_url
        self.kafka = dict(kafka)
        self.dlq_topic = dlq_topic
        self.label = f"lookups of {layout.processor}"
        self._redis: redis.Redis | None = None
        self._producer: Producer | None = None

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (created on first use)."""
        if self._redis is None:
            self._redis = redis_client(self.redis_url)
        return self._redis

    def table(self) -> tuple[int, int | None] | None:
        """The table processor's live generation and its watermark (None: no live one yet)."""
        ref = self.fold.lookup
        registry = GenerationRegistry.of(self.redis, ref.processor, self.layout.prefix)
        live = registry.live()
        if live is None:
            return None
        return live, generation_watermark(self.redis, registry.keys(live), self.table_lateness_ms)

    def run(self) -> int:
        """Join every pending event below the table's watermark; how many were joined."""
        table = self.table()
        if table is None:
            return 0
        live, watermark = table
        if watermark is None:
            return 0
        joined = 0
        while True:
            members = cast(
                "list[bytes]",
                # Strictly below: a table record exactly at its watermark is still on time, so
                # a version valid from the watermark itself may yet come.
                self.redis.zrangebyscore(
                    self.keys.timers(PENDING_TIMERS), "-inf", f"({watermark}", start=0, num=_CHUNK
                ),
            )
            if not members:
                break
            joined += self._join(members, live)
        self.done += joined
        return joined

    def _join(self, members: Sequence[bytes], table_generation: int) -> int:
        ref = self.fold.lookup
        table_keys = StateLayout(ref.processor, self.layout.prefix).generation(table_generation)
        waiting = [decode_pending(m) for m in members]
        keys: list[str | Exception | None] = []
        for pending in waiting:
            try:
                keys.append(self.fold.lookup_key(pending.event_type, pending.event))
            except Exception as exc:  # user code: this event only (a dead letter below)
                keys.append(exc)
        wanted = sorted({k for k in keys if isinstance(k, str)})
        names = [table_keys.table(ref.table, k) for k in wanted]
        raw = cast("list[bytes | None]", self.redis.mget(names)) if names else []
        rows = {k: None if r is None else orjson.loads(r) for k, r in zip(wanted, raw, strict=True)}
        argv: list[bytes | str | int] = []
        failed: list[tuple[Pending, str]] = []
        for member, pending, key in zip(members, waiting, keys, strict=True):
            try:
                if isinstance(key, Exception):
                    raise key
                at = event_time_ms(pending.event, self.event_time.field_of(pending.event_type))
                increments = Counter(
                    self.fold.enrich(pending.event_type, pending.event, rows.get(key or ""), at)
                )
            except Exception as exc:  # user code: this event only
                failed.append((pending, f"the lookup raised {exc!r}"))
                argv += [member, 0]
                continue
            changes = [(name, amount) for name, amount in sorted(increments.items()) if amount]
            argv += [member, len(changes)]
            for name, amount in changes:
                argv += [name, amount]
        if failed:
            self._dead_letters(failed)
        aggregate = self.keys.aggregate(self.fold.aggregate)
        return int(self.redis.eval(_JOIN, 2, self.keys.timers(PENDING_TIMERS), aggregate, *argv))

    def _dead_letters(self, failed: Sequence[tuple[Pending, str]]) -> None:
        """The events the fold failed on, to the dead-letter topic (acknowledged first)."""
        if self._producer is None:
            self._producer = output_producer(self.kafka)
        letters = [
            DeadLetter(
                SourceRecord(p.topic, p.partition, p.offset, None, orjson.dumps(p.event)),
                "enrich-error",
                detail,
            )
            for p, detail in failed
        ]
        sent = Deliveries(self._producer, f"{len(failed)} failed lookups to {self.dlq_topic}")
        produce_letters(sent, self.dlq_topic, letters, self.keys.processor, self.keys.generation)
        sent.wait()
