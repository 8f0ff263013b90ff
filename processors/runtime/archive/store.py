"""The archive's files on disk: atomic writes, the redundancy rule, orphans, ownership, locks.

Used by the archive's writer (``sink``, in Spark tasks) and by its commands
(``maintenance``: backfill, compact, status; ``cli``). Layout and rules are
:mod:`refold.processors.fold.archive`; besides the tables, the root holds ``_refold/`` (readers skip
names starting with ``_``):

* ``archive.json``: which processor, Redis key prefix and generation own the files (the applied
  positions that say which files are committed live there);
* ``intents/<topic>~p<partition>.json``: the last range a writer started on the partition and
  the directories it writes to, recorded before its first file. When the writer's next attempt
  finds the position still at that range's start, the files it may have left (orphans: written,
  never committed) can only be in those directories;
* ``maintenance.lock``: held by backfill and compaction (one at a time);
* ``covered/<topic>~p<partition>.json``: the ranges of the partition whose every record is in a
  file (:class:`~refold.contracts.archive_coverage.ArchiveLedger`), cut back with the files.

Besides the event tables, ``_raw/`` holds the records that are no archivable event (see
:data:`~refold.processors.fold.archive.RAW_TABLE`), laid out like a table.

Every file is written under a hidden temporary name (``.<name>.<random>.tmp``: pyarrow, Spark and
a ``*.parquet`` glob skip it) and renamed into place, so readers never see half a file.

Lifecycle: an :class:`ArchiveStore` holds paths and settings only (picklable); every method does
its own I/O. Shared storage must give POSIX rename and ``flock`` (a local disk, NFSv4, a CSI
volume); object stores are not supported (see docs/archive.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refold.contracts.archive_coverage import ARCHIVE_META_DIR, ArchiveLedger, replace_text
from refold.processors.errors import ProcessorConfigError, ProcessorError
from refold.processors.fold.archive import (
    RAW_TABLE,
    Coverage,
    date_dir,
    parse_date_dir,
    redundant,
)

__all__ = [
    "ArchiveBusyError",
    "ArchiveError",
    "ArchiveOwnerError",
    "ArchiveStore",
    "Intent",
    "Reconciled",
    "unify",
]

logger = logging.getLogger(__name__)

META_DIR = ARCHIVE_META_DIR
_TMP = re.compile(r"^\.(?P<name>.+\.parquet)\.[0-9a-f]+\.tmp$")


class ArchiveError(ProcessorError):
    """Base of the archive's errors."""

    code = "ARCHIVE_ERROR"


class ArchiveOwnerError(ProcessorConfigError):
    """The archive's files belong to another processor, key prefix or generation."""

    code = "ARCHIVE_OWNER"


class ArchiveBusyError(ArchiveError):
    """Another backfill or compaction holds the archive's maintenance lock."""

    code = "ARCHIVE_BUSY"
    retriable = True


@dataclass(frozen=True, slots=True)
class Intent:
    """The last range a writer started on one partition, and the directories it writes to."""

    start: int
    end: int
    dirs: tuple[str, ...]  # relative to the root


@dataclass(slots=True)
class Reconciled:
    """What making one partition's files agree with its applied position did."""

    removed: list[Path] = field(default_factory=list)
    truncated: list[Path] = field(default_factory=list)
    full_scan: bool = False


def unify(tables: Sequence[pa.Table]) -> pa.Table:
    """Concatenate tables of one event type written by different schema versions.

    A column some files lack becomes nullable and null there; the newest (last) table's
    column order and metadata win.

    Raises:
        pyarrow.ArrowInvalid: A column changed its type incompatibly.
    """
    if len(tables) == 1:
        return tables[0]
    names_in_all = set.intersection(*(set(t.column_names) for t in tables))
    merged = pa.unify_schemas([t.schema for t in reversed(tables)], promote_options="permissive")
    target = pa.schema(
        [f.with_nullable(f.nullable or f.name not in names_in_all) for f in merged],
        metadata=tables[-1].schema.metadata,
    )
    aligned = []
    for table in tables:
        columns = [
            table.column(f.name).cast(f.type)
            if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type)
            for f in target
        ]
        aligned.append(pa.Table.from_arrays(columns, schema=target))
    return pa.concat_tables(aligned)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ArchiveStore:
    """The files of one archive (see the module docstring).

    Args:
        root: The archive's directory.
        compression: Parquet codec of the files written.
        fsync: Flush files and directory entries before returning from a write.
    """

    root: Path
    compression: str = "zstd"
    fsync: bool = True

    # -- listing ----------------------------------------------------------------------------

    def tables(self) -> list[str]:
        """The event types with a table directory."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name[:1] not in "._")

    def dates(self, event_type: str) -> list[str]:
        """The dates of one table that have a directory."""
        table = self.root / event_type
        if not table.is_dir():
            return []
        return sorted(d for p in table.iterdir() if (d := parse_date_dir(p.name)) is not None)

    def date_dirs(self, *, raw: bool = False) -> Iterator[tuple[str, str, Path]]:
        """Every ``(event type, date, directory)`` of the archive (``raw``: and the raw table's)."""
        for event_type in [*self.tables(), *([RAW_TABLE] if raw else [])]:
            for date in self.dates(event_type):
                yield event_type, date, date_dir(self.root, event_type, date)

    @property
    def ledger(self) -> ArchiveLedger:
        """Which ranges of each partition the files cover entirely."""
        return ArchiveLedger(self.root, self.fsync)

    @staticmethod
    def files(directory: Path) -> list[tuple[Coverage, Path]]:
        """The archive files of a directory with their coverage (none when it is missing)."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            cov = Coverage.parse(name)
            if cov is not None:
                out.append((cov, directory / name))
        return sorted(out)

    def current_files(
        self, event_type: str, date_from: str = "0001-01-01", date_to: str = "9999-12-31"
    ) -> list[Path]:
        """The files of one table to read, without those the redundancy rule would delete.

        For readers that must not see rows twice while a compaction or backfill runs (between
        writing a covering file and deleting what it replaces): pass the list to pyarrow,
        DuckDB or Spark instead of the directory. A file deleted between this listing and the
        read is one that was replaced: list again.
        """
        out: list[Path] = []
        for date in self.dates(event_type):
            if not date_from <= date <= date_to:
                continue
            listed = dict(self.files(date_dir(self.root, event_type, date)))
            stale = set(redundant(listed))
            out.extend(path for cov, path in sorted(listed.items()) if cov not in stale)
        return out

    @staticmethod
    def temporaries(directory: Path) -> list[tuple[Coverage, Path]]:
        """Half-written files (a crash before their rename) with the coverage they were for."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            match = _TMP.match(name)
            cov = Coverage.parse(match["name"]) if match else None
            if cov is not None:
                out.append((cov, directory / name))
        return sorted(out)

    # -- writing ----------------------------------------------------------------------------

    def write(self, directory: Path, coverage: Coverage, table: pa.Table) -> Path:
        """Write ``table`` as the file of ``coverage`` in ``directory``, atomically.

        A file of the same name is replaced (a re-run batch writes the same rows again).
        """
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / coverage.file_name
        tmp = directory / f".{coverage.file_name}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            with tmp.open("wb") as sink:
                pq.write_table(table, sink, compression=self.compression)
                if self.fsync:
                    sink.flush()
                    os.fsync(sink.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if self.fsync:
            _fsync_dir(directory)
        return final

    def remove(self, paths: Sequence[Path]) -> None:
        """Delete files (already gone is fine), then flush their directories' entries."""
        dirs = set()
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            dirs.add(path.parent)
        if self.fsync:
            for directory in dirs:
                with contextlib.suppress(FileNotFoundError):
                    _fsync_dir(directory)

    def apply_rule(self, directory: Path) -> list[Path]:
        """Delete the files of ``directory`` that lie within another's range; the deleted."""
        listed = dict(self.files(directory))
        doomed = [listed[c] for c in redundant(listed)]
        self.remove(doomed)
        return doomed

    # -- one partition's files against its applied position -----------------------------------

    def _intent_path(self, topic: str, partition: int) -> Path:
        return self.root / META_DIR / "intents" / f"{topic}~p{partition}.json"

    def read_intent(self, topic: str, partition: int) -> Intent | None:
        """The partition's last intent (None: none, or unreadable)."""
        try:
            raw = json.loads(self._intent_path(topic, partition).read_text())
            return Intent(int(raw["start"]), int(raw["end"]), tuple(raw["dirs"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_intent(self, topic: str, partition: int, intent: Intent) -> None:
        """Record, before any file is written, where a range's files will go."""
        path = self._intent_path(topic, partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"start": intent.start, "end": intent.end, "dirs": list(intent.dirs)})
        replace_text(path, text, fsync=self.fsync)

    def reconcile(self, topic: str, partition: int, applied: int) -> Reconciled:
        """Make the partition's files agree with its applied position (before writing more).

        Every file of the partition that reaches past ``applied`` is uncommitted: one starting
        at or after it is an orphan of a crashed attempt and is deleted; one starting before
        it (only after the position went back: Redis lost writes, or an in-place reset) is cut
        to ``[start, applied)``. Where to look: the directories of the partition's last intent
        when the position is that intent's start (its attempt did not commit), nowhere when it
        is the intent's end (it did), and every directory otherwise.
        """
        done = Reconciled()
        # Nothing past the applied position is committed: neither the files nor the coverage.
        self.ledger.update(topic, partition, lambda covered: covered.cut(applied))
        intent = self.read_intent(topic, partition)
        if intent is not None and applied == intent.end:
            return done
        if intent is not None and applied == intent.start:
            dirs = [self.root / d for d in intent.dirs]
        else:
            done.full_scan = True
            dirs = [d for _t, _d, d in self.date_dirs(raw=True)]
        for directory in dirs:
            for cov, path in self.temporaries(directory):
                if (cov.topic, cov.partition) == (topic, partition) and cov.end > applied:
                    self.remove([path])
            for cov, path in self.files(directory):
                if (cov.topic, cov.partition) != (topic, partition) or cov.end <= applied:
                    continue
                if cov.start >= applied:
                    self.remove([path])
                    done.removed.append(path)
                else:
                    self._cut(directory, cov, path, applied)
                    done.truncated.append(path)
        if done.removed or done.truncated:
            logger.warning(
                "%s/%d: %d uncommitted files removed, %d cut back to the applied position %d",
                topic,
                partition,
                len(done.removed),
                len(done.truncated),
                applied,
                extra={"topic": topic, "partition": partition},
            )
        return done

    def _cut(self, directory: Path, cov: Coverage, path: Path, applied: int) -> None:
        """Replace a file reaching past ``applied`` by its rows below it, ``[start, applied)``."""
        table = pq.read_table(path)
        kept = table.filter(pc.less(table.column("kafka_offset"), applied))
        if kept.num_rows:
            self.write(directory, Coverage(cov.topic, cov.partition, cov.start, applied), kept)
        self.remove([path])

    # -- ownership and maintenance ----------------------------------------------------------

    @property
    def _owner_path(self) -> Path:
        return self.root / META_DIR / "archive.json"

    def owner(self) -> dict[str, Any] | None:
        """Who owns the files (``processor``, ``key_prefix``, ``generation``); None: nobody."""
        try:
            owner: dict[str, Any] = json.loads(self._owner_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            msg = f"{self._owner_path} is unreadable ({exc}). Operator action: restore it."
            raise ArchiveError(msg) from exc
        return owner

    def claim(self, processor: str, key_prefix: str, generation: int) -> None:
        """Take ownership of the files for a generation, or check that it has it.

        Raises:
            ArchiveOwnerError: Another processor, key prefix or generation owns them.
        """
        wanted = {"processor": processor, "key_prefix": key_prefix, "generation": generation}
        self._owner_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._owner_path.open("x") as out:  # exclusive: two starts cannot both claim
                stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                json.dump({**wanted, "claimed_at": stamp}, out)
            return
        except FileExistsError:
            pass
        owner = self.owner() or {}
        if {k: owner.get(k) for k in wanted} == wanted:
            return
        if (owner.get("processor"), owner.get("key_prefix")) != (processor, key_prefix):
            msg = (
                f"the archive at {self.root} belongs to processor {owner.get('processor')!r} "
                f"under Redis key prefix {owner.get('key_prefix')!r}, not {processor!r} under "
                f"{key_prefix!r}: two archives cannot share a directory. Operator action: give "
                f"this one its own root (REFOLD_{processor.upper()}__ROOT)."
            )
            raise ArchiveOwnerError(msg)
        msg = (
            f"{processor}: the archive at {self.root} was written by g{owner.get('generation')}, "
            f"not g{generation}. An archive is not rebuilt into a new generation (its files are "
            "not versioned by generation, so two writers would interleave). Operator action: "
            f"run {processor} in g{owner.get('generation')} (--generation live after `replay "
            f"rollback`); re-archive dates with `refold archive backfill --from D --to D`; or "
            f"rewrite everything from an offset with `replay --processor {processor} "
            "--in-place --execute`, which keeps the generation."
        )
        raise ArchiveOwnerError(msg)

    @contextlib.contextmanager
    def maintenance(self) -> Iterator[None]:
        """Hold the maintenance lock (backfill, compaction: one at a time).

        Raises:
            ArchiveBusyError: Another command holds it.
        """
        path = self.root / META_DIR / "maintenance.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                msg = (
                    f"{holder} is maintaining the archive at {self.root} (backfill or "
                    "compaction). Operator action: wait for it to finish, then run again."
                )
                raise ArchiveBusyError(msg) from exc
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()}")
            lock.flush()
            try:
                yield
            finally:
                lock.seek(0)
                lock.truncate()
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
