"""A fold transaction's applied positions: the hole check before it, their write inside it.

The applied positions in Redis are the truth (DESIGN.md decision 9). Before a batch,
:func:`check_holes` finds the partitions whose records start above their applied position
(Redis lost writes), which :meth:`~refold.processors.runtime.envelope.FoldWriter.apply` folds
again first. Inside the batch's MULTI, :func:`write_positions` queues the new positions with
everything that must move with them (links, event-time clocks, origin marks, dead-letter index
entries, guards).

Lifecycle: pure functions of a pipeline and a target; they run where the writer runs (a Spark
executor's Python worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from refold.contracts.layout import BATCH_ID_FIELD, position_field
from refold.contracts.store.connect import pipelined_eval
from refold.processors.fold.records import SourceRecord
from refold.processors.fold.rekey import Link, encode_link
from refold.processors.runtime.fold_target import FoldTarget
from refold.processors.runtime.lateness import write_clocks

__all__ = ["HoleError", "check_holes", "write_positions"]

# Re-keyed generations: the generation's positions are the minimum over its writer slots'
# positions, recomputed atomically in the slot's transaction (KEYS[1] positions, KEYS[2..] the
# slots' hashes, ARGV the fields). A slot without a position for a field leaves it alone.
_MIN_POSITIONS = """
for _, f in ipairs(ARGV) do
  local low = nil
  for i = 2, #KEYS do
    local v = redis.call('HGET', KEYS[i], f)
    if not v then low = nil break end
    v = tonumber(v)
    if low == nil or v < low then low = v end
  end
  if low ~= nil then redis.call('HSET', KEYS[1], f, low) end
end
return 0
"""


class HoleError(Exception):
    """Records start above the applied position: the ranges in between must be folded first."""

    def __init__(self, ranges: dict[str, tuple[int, int]]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def check_holes(
    records: Sequence[SourceRecord],
    applied: Mapping[str, int],
    covered: Mapping[str, tuple[int, int]],
) -> None:
    """Raise :class:`HoleError` where a partition's records start above its applied position.

    A partition without an applied position has no hole: processors write the starting
    positions of a generation before its first batch, so only a brand-new writer lacks them.
    """
    starts = {f: start for f, (start, _end) in covered.items()}
    for record in records:
        field_name = position_field(record.topic, record.partition)
        if field_name not in starts:
            starts[field_name] = record.offset
    holes = {
        f: (applied[f], start) for f, start in starts.items() if f in applied and applied[f] < start
    }
    if holes:
        raise HoleError(holes)


def write_positions(
    pipe: Pipeline,
    target: FoldTarget,
    slot: int | None,
    positions_key: str,
    new_pos: Mapping[str, int],
    clocks: Mapping[str, int],
    marks: Mapping[str, str],
    links: Sequence[tuple[str, str, Link]],
    batch_id: int | None,
    letters: Mapping[str, str] | None = None,
) -> None:
    """Queue (inside MULTI) the links, clocks, origin marks, letters, positions and guards."""
    if letters:
        pipe.hset(target.keys.dead_letters, mapping={f: r for f, r in letters.items()})
    keys = target.keys
    for via, value, link in links:
        pipe.hsetnx(keys.links(via), value, encode_link(link))
    write_clocks(pipe, keys, clocks, slot, target.slots)
    if marks:
        marks_update: dict[FieldT, EncodableT] = {f: m for f, m in marks.items()}
        pipe.hset(keys.origin_marks, mapping=marks_update)
    position_update: dict[FieldT, EncodableT] = {f: str(o) for f, o in new_pos.items()}
    if batch_id is not None:
        position_update[BATCH_ID_FIELD] = str(batch_id)
    if position_update:
        pipe.hset(positions_key, mapping=position_update)
    if slot is None:
        for field_name, offset in new_pos.items():
            pipe.set(keys.guard(field_name), offset)
    else:
        pipe.incr(keys.slot_guard(slot))
        if new_pos:
            applied = target.positions(pipe)
            slot_keys = applied.slot_keys()
            pipelined_eval(
                pipe, _MIN_POSITIONS, 1 + len(slot_keys), applied.key, *slot_keys, *new_pos
            )
