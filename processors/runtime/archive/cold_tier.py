"""The log's cold tier: the records below a partition's log start, read from the archive.

DESIGN.md decision 20. Kafka deletes the head of a topic (retention); the archive processor
has kept every record of the ranges it covered (its ledger,
:class:`~refold.contracts.archive_coverage.ArchiveLedger`), with the bytes, key, headers and
timestamp Kafka handed over. :func:`read_archived` hands those records over again, in offset
order, as :class:`ArchivedMessage` objects that answer what a confluent-kafka message answers:
the fold, its event time and its positions cannot tell them from the log's. Positions stay
Kafka offsets, so the exactly-once transaction, the flip, rollback and snapshots do not change.

Executor side (a Spark task reading its ranges, :func:`~refold.processors.runtime.kafka_ranges.
read_messages`); nothing is cached between calls. It reads a window of
offsets at a time (every file that overlaps it, its rows sorted by offset together), so memory
stays bounded whatever the span and however compaction merged the files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refold.contracts.archive_coverage import ArchiveLedger, Span
from refold.processors.errors import ProcessorError
from refold.processors.fold.archive import Coverage, redundant
from refold.processors.runtime.archive.store import ArchiveStore

__all__ = ["ArchiveGapError", "ArchivedMessage", "ColdTierError", "archive_gaps", "read_archived"]

# Records per yielded chunk: as many as one Kafka consume() hands over.
_CHUNK = 10_000
# Offsets read and sorted together: ~20 MB of rows at most, and few re-reads of a file that
# spans several windows (row groups outside a window are skipped by their statistics).
_WINDOW = 200_000
_COLUMNS = (
    "kafka_offset",
    "kafka_key",
    "kafka_value",
    "kafka_headers",
    "kafka_timestamp",
    "kafka_timestamp_type",
)


class ColdTierError(ProcessorError):
    """An archive file cannot serve a replay: it does not read, or its rows disagree with it."""

    code = "COLD_TIER_FILE"


class ArchiveGapError(ColdTierError):
    """The archive does not hold every record of a span below the log start."""

    code = "COLD_TIER_GAP"


class ArchivedMessage(tuple[Any, ...]):
    """A record read back from the archive, answering like a ``confluent_kafka.Message``.

    A tuple ``(topic, partition, offset, key, value, headers, (timestamp type, ms))``: made a
    few hundred thousand times a second on a rebuild's hot path, where a dataclass's
    ``__init__`` costs several times a tuple's.
    """

    __slots__ = ()

    def topic(self) -> str:  # noqa: D102 - confluent-kafka's accessors
        return str(self[0])

    def partition(self) -> int:  # noqa: D102
        return int(self[1])

    def offset(self) -> int:  # noqa: D102
        return int(self[2])

    def key(self) -> bytes | None:  # noqa: D102
        return self[3]  # type: ignore[no-any-return]

    def value(self) -> bytes | None:  # noqa: D102
        return self[4]  # type: ignore[no-any-return]

    def headers(self) -> list[tuple[str, bytes | None]] | None:  # noqa: D102
        return list(self[5]) or None

    def timestamp(self) -> tuple[int, int]:  # noqa: D102
        return self[6]  # type: ignore[no-any-return]

    def error(self) -> None:  # noqa: D102
        return None


def archive_gaps(root: Path, topic: str, partition: int, start: int, end: int) -> list[Span]:
    """The parts of ``[start, end)`` of a partition the archive at ``root`` does not cover."""
    return ArchiveLedger(root, fsync=False).read(topic, partition).gaps(start, end)


def _files(
    store: ArchiveStore, topic: str, partition: int, start: int, end: int
) -> list[tuple[Coverage, Path]]:
    """The partition's files (every table, the raw one too) that overlap ``[start, end)``.

    Per directory without those the redundancy rule would delete (a compaction or backfill
    between its two steps), so no record is read twice.
    """
    out: list[tuple[Coverage, Path]] = []
    for _type, _date, directory in store.date_dirs(raw=True):
        listed = dict(store.files(directory))
        stale = set(redundant(listed))
        out.extend(
            (cov, path)
            for cov, path in listed.items()
            if cov not in stale
            and (cov.topic, cov.partition) == (topic, partition)
            and cov.start < end
            and cov.end > start
        )
    return sorted(out)


def _window(files: list[tuple[Coverage, Path]], start: int, end: int) -> pa.Table:
    """The rows of ``files`` with offsets in ``[start, end)``, in offset order, checked.

    Raises:
        ColdTierError: A file lacks the record bytes, does not read, or holds rows outside the
            range its name covers; two files hold the same offset.
    """
    parts = []
    for _cov, path in files:
        try:
            # Row groups whose offset statistics lie outside the window are not read.
            table = pq.read_table(
                path,
                columns=list(_COLUMNS),
                filters=[("kafka_offset", ">=", start), ("kafka_offset", "<", end)],
            )
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            msg = f"{path} does not read as an archive file ({exc}): it cannot serve a replay"
            raise ColdTierError(msg) from exc
        if table.num_rows:
            if table.column("kafka_timestamp_type").null_count:
                msg = f"{path}: rows without record bytes (written before they were kept)"
                raise ColdTierError(msg)
            parts.append(table)
    if not parts:
        return pa.table({c: [] for c in _COLUMNS})
    rows = pa.concat_tables(parts).sort_by("kafka_offset")
    offsets = rows.column("kafka_offset").to_numpy()
    twice = offsets[1:][np.diff(offsets) == 0]
    if len(twice):
        msg = f"offset {int(twice[0])} is in two archive files"
        raise ColdTierError(msg)
    return rows


def _check(cov: Coverage, path: Path) -> None:
    """The file can serve: it has the record bytes, and its offsets lie within its name's range.

    From the file's footer only (its schema and the row groups' offset statistics).

    Raises:
        ColdTierError: It cannot, with its path.
    """
    try:
        metadata = pq.ParquetFile(path).metadata
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        msg = f"{path} does not read as an archive file ({exc}): it cannot serve a replay"
        raise ColdTierError(msg) from exc
    names = metadata.schema.to_arrow_schema().names
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        msg = (
            f"{path} was written before the archive kept each record's bytes (no "
            f"{', '.join(missing)}): it cannot serve a replay. Operator action: replay from "
            "the log start with --allow-data-loss, or from a target the log still has."
        )
        raise ColdTierError(msg)
    # The Parquet leaf column (nested event fields make leaves an Arrow field index is not).
    leaves = metadata.schema
    column = next(i for i in range(len(leaves)) if leaves.column(i).path == "kafka_offset")
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            continue
        if stats.min < cov.start or stats.max >= cov.end:
            msg = (
                f"{path}: offsets {stats.min}..{stats.max} are outside the range its name "
                f"covers [{cov.start}, {cov.end}): the file cannot serve a replay. Operator "
                "action: restore it, or run `refold archive compact`."
            )
            raise ColdTierError(msg)


def _messages(topic: str, partition: int, rows: pa.Table) -> list[ArchivedMessage]:
    """The rows as messages (the one per-record Python loop of a read)."""
    timestamps = rows.column("kafka_timestamp").cast(pa.int64()).fill_null(0).to_pylist()
    column = rows.column("kafka_headers")
    # Most records carry no headers: skip making a dict per header of nothing.
    no_headers = not pc.max(pc.list_value_length(column)).as_py()
    headers_of = [()] * rows.num_rows if no_headers else column.to_pylist()
    made = tuple.__new__
    out = []
    for offset, key, value, headers, ts, ts_type in zip(
        rows.column("kafka_offset").to_pylist(),
        rows.column("kafka_key").to_pylist(),
        rows.column("kafka_value").to_pylist(),
        headers_of,
        timestamps,
        rows.column("kafka_timestamp_type").to_pylist(),
        strict=True,
    ):
        kept = tuple((h["key"], h["value"]) for h in headers) if headers else ()
        out.append(
            made(ArchivedMessage, (topic, partition, offset, key, value, kept, (ts_type, ts)))
        )
    return out


def read_archived(
    root: Path, topic: str, partition: int, start: int, end: int
) -> Iterator[list[ArchivedMessage]]:
    """Every record of ``[start, end)`` of one partition, from the archive, in offset order.

    Read a window of offsets at a time (every file overlapping it, sorted by offset together),
    so memory stays bounded whatever the span and however the files were compacted.

    Raises:
        ArchiveGapError: The archive's ledger does not cover the whole span (before anything
            is yielded).
        ColdTierError: A file does not read, lacks the record bytes, or holds rows outside the
            range its name says (with its path); two files hold the same offset.
    """
    gaps = archive_gaps(root, topic, partition, start, end)
    if gaps:
        missing = ", ".join(f"{s}..{e - 1}" for s, e in gaps)
        msg = (
            f"{topic}/{partition}: offsets {missing} are below the log start and not in the "
            f"archive at {root}: they cannot be replayed. Operator action: replay from a "
            "target the archive or the log covers, or pass --allow-data-loss."
        )
        raise ArchiveGapError(msg)
    files = _files(ArchiveStore(root), topic, partition, start, end)
    for cov, path in files:
        _check(cov, path)
    for low in range(start, end, _WINDOW):
        high = min(end, low + _WINDOW)
        overlapping = [(c, p) for c, p in files if c.start < high and c.end > low]
        rows = _window(overlapping, low, high)
        for first in range(0, rows.num_rows, _CHUNK):
            yield _messages(topic, partition, rows.slice(first, _CHUNK))
