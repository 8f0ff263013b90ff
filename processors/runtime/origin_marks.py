"""The origin marks: which records another processor sent again, skipped before the fold.

An upstream processor's outputs carry an origin id: an ordered stream and a sequence number in
it (:mod:`refold.contracts.origin`). Per source partition (and writer slot), the highest
sequence applied of each stream is kept with the positions (the generation's ``origin_marks``
hash, written in the batch's transaction by
:func:`~refold.processors.runtime.applied_positions.write_positions`).

Lifecycle: a pure function of a pipeline and a target; runs where the writer runs.
"""

from __future__ import annotations

from typing import cast

from redis.client import Pipeline

from refold.contracts.layout import position_field
from refold.contracts.origin import parse_origin_id
from refold.processors.runtime.fold_target import BatchOutcome, FoldTarget, PendingRecord

__all__ = ["drop_resent"]


def _parse_seq(raw: bytes) -> tuple[int, int]:
    offset, _dot, index = raw.decode().partition(".")
    return int(offset), int(index or 0)


def drop_resent(
    pipe: Pipeline,
    target: FoldTarget,
    slot: int | None,
    pending: list[PendingRecord],
    outcome: BatchOutcome,
) -> tuple[list[PendingRecord], dict[str, str]]:
    """Skip the records another processor sent again; the origin marks to store.

    A record at or below its stream's mark was applied already (a re-sent batch, a replay's
    cutover overlap).
    """
    scope = "" if slot is None else f"s{slot}|"
    seqs = [parse_origin_id(p[0].origin) for p in pending]
    fields = sorted(
        {
            f"{scope}{position_field(p[0].topic, p[0].partition)}|{o.stream}"
            for p, o in zip(pending, seqs, strict=True)
            if o is not None
        }
    )
    raw = cast("list[bytes | None]", pipe.hmget(target.keys.origin_marks, fields))
    marks: dict[str, tuple[int, int]] = {
        f: _parse_seq(v) for f, v in zip(fields, raw, strict=True) if v is not None
    }
    kept = []
    moved: dict[str, str] = {}
    for entry, origin in zip(pending, seqs, strict=True):
        if origin is not None:
            record = entry[0]
            name = f"{scope}{position_field(record.topic, record.partition)}|{origin.stream}"
            mark = marks.get(name)
            if mark is not None and origin.seq <= mark:
                outcome.duplicates += 1
                continue
            marks[name] = origin.seq
            moved[name] = f"{origin.offset}.{origin.nth}"
        kept.append(entry)
    return kept, moved
