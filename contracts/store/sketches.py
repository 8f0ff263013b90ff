"""Distinct counts over HyperLogLogs kept in several hash slots: the estimate of their union.

``PFCOUNT k1 k2 ...`` estimates the number of distinct values of the union of its sketches, but
a Redis Cluster refuses it (and ``PFMERGE``) when the keys are in two slots, as the shards of a
window processor sharded by partition id are. :class:`UnionCounts` gives the same number there:
it reads each sketch with ``GET`` (an HLL is a string; a pipeline routes each read to its node),
then one script in a scratch slot writes them to scratch keys, merges them (``PFMERGE``), counts
(``PFCOUNT``) and deletes the scratch keys before it returns: they never outlive the script, so
nothing sees them and nothing is left behind if the client dies.

It is exact, not another estimate: a HyperLogLog is its registers, a union is their maximum
register by register (what ``PFMERGE`` and a multi-key ``PFCOUNT`` both compute), and the
estimate depends on the registers only, so the union of the shards' sketches counts exactly
what one sketch of all the values would. Estimating in Python from the raw strings would need a
second copy of Redis' HLL encodings and estimator, which could drift from the server's.

On a single Redis, or when every key of a group is in one slot, it is one ``PFCOUNT`` per group,
in the caller's pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.crc import key_slot

from refold.contracts.store.connect import is_cluster, pipelined_pfcount

__all__ = ["MERGE_BATCH", "UnionCounts", "merge_arguments", "union_counts"]

# Sketches merged per PFMERGE in the script (scratch keys 2..MERGE_BATCH+1): bounded, so that
# neither the script's unpack() nor its KEYS grow with a read of thousands of sketches.
MERGE_BATCH = 64

# KEYS[1]: the accumulator; KEYS[2..]: scratch keys for one batch. ARGV: per group, its number
# of sketches n, then the n HLL strings. Returns each group's PFCOUNT. Every scratch key is
# deleted before the script returns.
_UNION = """
local out, i, room = {}, 1, #KEYS - 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call('DEL', KEYS[1])
  local done = 0
  while done < n do
    local k = math.min(room, n - done)
    for j = 1, k do redis.call('SET', KEYS[j + 1], ARGV[i + done + j]) end
    redis.call('PFMERGE', KEYS[1], unpack(KEYS, 2, k + 1))
    done = done + k
  end
  out[#out + 1] = n == 0 and 0 or redis.call('PFCOUNT', KEYS[1])
  i = i + 1 + n
end
redis.call('DEL', unpack(KEYS))
return out
"""


def merge_arguments(groups: Sequence[Sequence[bytes | None]]) -> list[int | bytes]:
    """The script's ARGV: per group, its number of sketches, then those that exist.

    A sketch that does not exist (``None``: ``GET`` found no key) counts nothing, as a missing
    key in ``PFCOUNT`` does.
    """
    argv: list[int | bytes] = []
    for group in groups:
        present = [s for s in group if s is not None]
        argv += [len(present), *present]
    return argv


@dataclass(slots=True)
class UnionCounts:
    """Per group of HyperLogLog keys: ``PFCOUNT`` of them all (the count of their union).

    Where every group's keys are in one slot (a single Redis, or a cluster and one slot each),
    :meth:`queue` puts one ``PFCOUNT`` per group in the caller's pipeline, with its other reads
    (a transaction stays one). Where they are not (a cluster, a sharded generation), it queues
    nothing and :meth:`counts` reads and merges the sketches itself (the module's docstring).

    Args:
        client: A client of a single Redis or of a cluster.
        groups: The keys of each count (any slots; missing keys count nothing).
        scratch: A key prefix with a hash tag (``GenerationKeys.scratch``): the merge script's
            scratch keys, in one slot, live only while it runs.
    """

    client: redis.Redis
    groups: Sequence[Sequence[str]]
    scratch: str
    spread: bool = field(init=False)

    def __post_init__(self) -> None:
        self.spread = is_cluster(self.client) and any(
            len({key_slot(k.encode()) for k in group}) > 1 for group in self.groups
        )

    def queue(self, pipe: Any) -> int:
        """Queue the counts in ``pipe`` if they can run there; the number of replies queued."""
        if self.spread:
            return 0
        queued = 0
        for group in self.groups:
            if group:
                pipelined_pfcount(pipe, *group)
                queued += 1
        return queued

    def counts(self, replies: Sequence[Any] = ()) -> list[int]:
        """The counts, in group order, from the replies :meth:`queue` queued (or merged now)."""
        if self.spread:
            return self._merged()
        found = iter(replies)
        return [int(next(found)) if group else 0 for group in self.groups]

    def _merged(self) -> list[int]:
        """Read every sketch (``GET``), then merge and count each group in one script."""
        with self.client.pipeline(transaction=False) as pipe:
            for group in self.groups:
                for key in group:
                    pipe.get(key)
            raw = iter(cast("list[bytes | None]", pipe.execute()))
        sketches = [[next(raw) for _ in group] for group in self.groups]
        names = [f"{self.scratch}:{i}" for i in range(1 + MERGE_BATCH)]
        argv = merge_arguments(sketches)
        counts = self.client.eval(_UNION, len(names), *names, *argv)  # its keys: one slot
        return [int(c) for c in cast("list[int]", counts)]


def union_counts(client: redis.Redis, groups: Sequence[Sequence[str]], scratch: str) -> list[int]:
    """:class:`UnionCounts` in a round trip of their own (two where the sketches are spread)."""
    union = UnionCounts(client, groups, scratch)
    if union.spread or not any(groups):
        return union.counts()
    with client.pipeline(transaction=False) as pipe:
        union.queue(pipe)
        return union.counts(pipe.execute())
