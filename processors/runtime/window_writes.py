"""What one transaction writes for a window processor, and for an entity fold's timers.

:func:`write_windows` queues, inside the envelope's MULTI, what a :class:`WindowDelta` adds, in
one Lua call: HINCRBY for counts and sums, minimum and maximum, PFADD for distinct values; and
the close and expiry timers (sorted sets scored by event time; they are fired by
:class:`~refold.processors.runtime.window_store.WindowCloser`). Every one of these commutes, so
the tasks of several partitions add to one bucket, each under its own partition's guard.
"""

from __future__ import annotations

from redis.client import Pipeline

from refold.contracts.layout import GenerationKeys
from refold.contracts.store.connect import pipelined_eval
from refold.processors.fold.timers import TimerQueue
from refold.processors.fold.windows import CLOSE_TIMERS, EXPIRE_TIMERS, WindowDelta

__all__ = ["timers_key", "write_timers", "write_windows"]

# One call for all of a transaction's bucket writes (not a command per field: packing and
# parsing ~10k commands a batch cost the client more than the fold). KEYS: bucket hashes and
# sketches. ARGV: the number of buckets, then per bucket: its index into KEYS, i increments
# and e extremes, the i (field, amount) and the e ("min:"/"max:" field, value) pairs; then per
# sketch: its index, n and its n values. Amounts and values go to Redis as sent (exact); the
# extremes compare as Lua numbers (exact up to 2^53).
_ADD = """
local i = 2
for _ = 1, tonumber(ARGV[1]) do
  local key, adds, extremes = KEYS[tonumber(ARGV[i])], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  i = i + 3
  for _ = 1, adds do
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  for _ = 1, extremes do
    local f, v = ARGV[i], ARGV[i + 1]
    local cur = redis.call('HGET', key, f)
    if not cur or (string.sub(f, 1, 4) == 'min:' and tonumber(v) < tonumber(cur))
        or (string.sub(f, 1, 4) == 'max:' and tonumber(v) > tonumber(cur)) then
      redis.call('HSET', key, f, v)
    end
    i = i + 2
  end
end
while i <= #ARGV do
  local key, last = KEYS[tonumber(ARGV[i])], i + 1 + tonumber(ARGV[i + 1])
  i = i + 2
  while i <= last do
    local upto = math.min(i + 999, last)  -- unpack's stack is limited
    redis.call('PFADD', key, unpack(ARGV, i, upto))
    i = upto + 1
  end
end
return 0
"""


def write_windows(pipe: Pipeline, keys: GenerationKeys, delta: WindowDelta) -> None:
    """Queue (inside MULTI) the bucket increments, extremes, sketches and timers of ``delta``.

    One Lua call writes the buckets and sketches (:data:`_ADD`), one ZADD each set of timers.
    """
    fields: dict[str, tuple[str, str, str]] = {}  # measure -> its sum, min and max fields
    names: list[str] = []
    argv: list[str | int] = [len(delta.buckets)]
    sketches: list[tuple[tuple[str, str, int, str], set[str]]] = []
    for (window, start, group), cell in delta.buckets.items():
        names.append(keys.window_bucket(window, start, group))
        sums = cell.sums
        argv += (len(names), 1 + len(sums), 2 * len(sums), "count", cell.count)
        for name, total in sums.items():
            known = fields.get(name)
            if known is None:
                known = fields[name] = (f"sum:{name}", f"min:{name}", f"max:{name}")
            argv += (known[0], total)
        for name, low in cell.lows.items():
            argv += (fields[name][1], low)
        for name, high in cell.highs.items():
            argv += (fields[name][2], high)
        for name, members in cell.distinct.items():
            sketches.append(((window, name, start, group), members))
    for sketch, members in sketches:
        names.append(keys.window_distinct(*sketch))
        argv += (len(names), len(members), *sorted(members))
    if names:
        pipelined_eval(pipe, _ADD, len(names), *names, *argv)
    if delta.closes:
        pipe.zadd(keys.timers(CLOSE_TIMERS), delta.closes)
    if delta.expiries:
        pipe.zadd(keys.timers(EXPIRE_TIMERS), delta.expiries)


def write_timers(
    pipe: Pipeline, keys: GenerationKeys, queue: TimerQueue, slot: int | None = None
) -> None:
    """Queue (inside MULTI) the entity timers that changed: ZADD the due ones, ZREM the rest.

    Per partition id, or re-keyed in the writer ``slot``'s one set (its group is ``0``).
    """
    due: dict[int, dict[str, int]] = {}
    gone: dict[int, list[str]] = {}
    for (partition, entity), at in queue.changed.items():
        if at is None:
            gone.setdefault(partition, []).append(entity)
        else:
            due.setdefault(partition, {})[entity] = at
    for partition, members in sorted(gone.items()):
        pipe.zrem(timers_key(keys, partition, slot), *members)
    for partition, mapping in sorted(due.items()):
        pipe.zadd(timers_key(keys, partition, slot), mapping)


def timers_key(keys: GenerationKeys, group: int, slot: int | None) -> str:
    """The sorted set of a timer group: a partition id's, or re-keyed the writer slot's."""
    return keys.entity_timers(group) if slot is None else keys.slot_timers(slot)
