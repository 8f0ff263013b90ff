"""Which offsets of each partition the archive covers: its ledger, beside its files.

The archive is the log's cold tier (DESIGN.md decision 20): a replay below a partition's log
start reads the archive from its target up to the log start. It may only do so where the
archive holds *every* record of that span. File names cannot tell: a batch in which no record
could be archived (only transaction markers, or only records that went to the dead-letter
topic) writes no file. So the archive writer records each range it has processed in a ledger
per partition, and cuts it back exactly as it cuts its files back (an orphan of a crashed
attempt, a position that went back):

``<archive root>/_refold/covered/<topic>~p<partition>.json``: ``{"ranges": [[start, end], ...]}``,
merged and sorted, ``end`` exclusive.

Shared by the writer (processors) and the replay plan (replay), so it lives in the kernel.
An :class:`ArchiveLedger` holds a path only (picklable); every method does its own I/O, under
an exclusive ``flock`` when it changes the ledger (the live writer and a backfill may both).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARCHIVE_META_DIR", "ArchiveLedger", "CoveredRanges", "Span", "replace_text"]

# The archive's bookkeeping directory (readers of the tables skip names starting with "_").
ARCHIVE_META_DIR = "_refold"
# ``[start, end)`` of one partition.
Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class CoveredRanges:
    """The merged, sorted ranges of one partition the archive holds every record of (pure)."""

    ranges: tuple[Span, ...] = ()

    def add(self, start: int, end: int) -> CoveredRanges:
        """These ranges and ``[start, end)``, adjacent and overlapping ones merged."""
        if end <= start:
            return self
        merged: list[Span] = []
        for s, e in sorted([*self.ranges, (start, end)]):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        return CoveredRanges(tuple(merged))

    def cut(self, at: int) -> CoveredRanges:
        """These ranges below ``at`` only (the writer's files past ``at`` were removed)."""
        return CoveredRanges(tuple((s, min(e, at)) for s, e in self.ranges if s < at))

    def gaps(self, start: int, end: int) -> list[Span]:
        """The parts of ``[start, end)`` no range covers, in order."""
        out: list[Span] = []
        at = start
        for s, e in self.ranges:
            if e <= at:
                continue
            if s >= end:
                break
            if s > at:
                out.append((at, s))
            at = max(at, e)
            if at >= end:
                break
        if at < end:
            out.append((at, end))
        return out

    def earliest_before(self, offset: int) -> int:
        """The first offset from which every record up to ``offset`` is covered (else it)."""
        for s, e in self.ranges:
            if s < offset <= e:
                return s
        return offset

    def describe(self) -> str:
        """For people: ``0-5120, 6000-9000`` (``end`` exclusive), or ``none``."""
        return ", ".join(f"{s}-{e}" for s, e in self.ranges) or "none"


@dataclass(frozen=True, slots=True)
class ArchiveLedger:
    """The coverage ledger of an archive root (paths only; picklable)."""

    root: Path
    fsync: bool = True

    @property
    def directory(self) -> Path:
        """Where the partitions' ledgers are."""
        return self.root / ARCHIVE_META_DIR / "covered"

    def is_archive(self) -> bool:
        """Whether ``root`` holds an archive (its owner file exists)."""
        return (self.root / ARCHIVE_META_DIR / "archive.json").is_file()

    def _path(self, topic: str, partition: int) -> Path:
        return self.directory / f"{topic}~p{partition}.json"

    def read(self, topic: str, partition: int) -> CoveredRanges:
        """The partition's covered ranges (none recorded: empty)."""
        try:
            raw = json.loads(self._path(topic, partition).read_text())
        except FileNotFoundError:
            return CoveredRanges()
        return CoveredRanges(tuple((int(s), int(e)) for s, e in raw["ranges"]))

    def update(
        self, topic: str, partition: int, change: Callable[[CoveredRanges], CoveredRanges]
    ) -> CoveredRanges:
        """Apply ``change`` to the partition's ledger, atomically; the new ranges."""
        path = self._path(topic, partition)
        with self._locked(path):
            before = self.read(topic, partition)
            after = change(before)
            if after != before:
                self._write(path, after)
        return after

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(f"{path.name}.lock")
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _write(self, path: Path, covered: CoveredRanges) -> None:
        text = json.dumps({"ranges": [list(r) for r in covered.ranges]})
        replace_text(path, text, fsync=self.fsync)


def replace_text(path: Path, text: str, *, fsync: bool) -> None:
    """Write ``text`` as ``path``, atomically: a hidden temporary file renamed into place.

    With ``fsync``, the file and then its directory entry are flushed to disk first, so a
    power cut leaves the old text or the new one (the archive's bookkeeping files).
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    with tmp.open("w") as out:
        out.write(text)
        if fsync:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)
    if fsync:
        descriptor = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
