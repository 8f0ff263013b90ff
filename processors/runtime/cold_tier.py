"""The log's cold tier: the records below a partition's log start, read from the archive.

DESIGN.md decision 20. Kafka deletes the head of a topic (retention); the archive processor
has kept every record of the ranges it covered (its ledger,
:class:`~refold.contracts.archive_coverage.ArchiveLedger`), with the bytes, key, headers and
timestamp Kafka handed over. :func:`read_archived` hands those records over again, in offset
order, as :class:`ArchivedMessage` objects that answer what a confluent-kafka message answers:
the fold, its event time and its positions cannot tell them from the log's. Positions stay
Kafka offsets, so the exactly-once transaction, the flip, rollback and snapshots do not change.

Executor side (a Spark task reading its ranges, :func:`~refold.processors.runtime.kafka_ranges.
read_messages`); nothing is cached between calls. Files are opened as the merge reaches their
first offset and read a row group at a time, so memory stays bounded by the files that overlap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from refold.contracts.archive_coverage import ArchiveLedger, Span
from refold.processors.errors import ProcessorError
from refold.processors.fold.archive import Coverage, redundant
from refold.processors.runtime.archive_store import ArchiveStore

__all__ = ["ArchiveGapError", "ArchivedMessage", "ColdTierError", "archive_gaps", "read_archived"]

# Records per yielded chunk: as many as one Kafka consume() hands over.
_CHUNK = 10_000
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


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A record read back from the archive, answering like a ``confluent_kafka.Message``."""

    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None
    _headers: tuple[tuple[str, bytes | None], ...]
    _timestamp: tuple[int, int]

    def topic(self) -> str:  # noqa: D102 - confluent-kafka's accessors
        return self._topic

    def partition(self) -> int:  # noqa: D102
        return self._partition

    def offset(self) -> int:  # noqa: D102
        return self._offset

    def key(self) -> bytes | None:  # noqa: D102
        return self._key

    def value(self) -> bytes | None:  # noqa: D102
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:  # noqa: D102
        return list(self._headers) or None

    def timestamp(self) -> tuple[int, int]:  # noqa: D102
        return self._timestamp

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


def _rows(
    cov: Coverage, path: Path, topic: str, start: int, end: int
) -> Iterator[tuple[int, ArchivedMessage]]:
    """One file's records within ``[start, end)``, checked against the file's name."""
    try:
        parquet = pq.ParquetFile(path)
        missing = [c for c in _COLUMNS if c not in parquet.schema_arrow.names]
        if missing:
            msg = (
                f"{path} was written before the archive kept each record's bytes (no "
                f"{', '.join(missing)}): it cannot serve a replay. Operator action: replay from "
                "the log start with --allow-data-loss, or from a target the log still has."
            )
            raise ColdTierError(msg)
        batches = parquet.iter_batches(columns=list(_COLUMNS), batch_size=_CHUNK)
        previous = -1
        for batch in batches:
            columns = batch.to_pydict()
            # Epoch milliseconds as Kafka gave them (no float round trip through datetime).
            columns["kafka_timestamp"] = (
                batch.column("kafka_timestamp").cast(pa.int64()).to_pylist()
            )
            for offset, key, value, headers, ts, ts_type in zip(
                *(columns[c] for c in _COLUMNS), strict=True
            ):
                if not cov.start <= offset < cov.end or offset <= previous:
                    msg = (
                        f"{path}: offset {offset} is outside the range its name covers "
                        f"[{cov.start}, {cov.end}) or out of order: the file cannot serve a "
                        "replay. Operator action: restore it, or run `refold archive compact`."
                    )
                    raise ColdTierError(msg)
                previous = offset
                if value is None and ts_type is None:
                    msg = f"{path}: offset {offset} has no record bytes (an older row)"
                    raise ColdTierError(msg)
                if offset < start:
                    continue
                if offset >= end:
                    return
                millis = 0 if ts is None else int(ts)
                kept = tuple((h["key"], h["value"]) for h in headers or ())
                message = ArchivedMessage(
                    topic, cov.partition, offset, key, value, kept, (int(ts_type), millis)
                )
                yield offset, message
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        msg = f"{path} does not read as an archive file ({exc}): it cannot serve a replay"
        raise ColdTierError(msg) from exc


def read_archived(
    root: Path, topic: str, partition: int, start: int, end: int
) -> Iterator[list[ArchivedMessage]]:
    """Every record of ``[start, end)`` of one partition, from the archive, in offset order.

    Raises:
        ArchiveGapError: The archive's ledger does not cover the whole span (before anything
            is yielded).
        ColdTierError: A file does not read, lacks the record bytes, or holds rows outside
            the range its name says (with its path); two files hold the same offset.
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
    store = ArchiveStore(root)
    pending = _files(store, topic, partition, start, end)
    # A sweep merge by offset: every file's rows are in offset order and start at or after
    # its name's start, so a file is opened only when the merge reaches that start.
    heap: list[tuple[int, int, ArchivedMessage, Iterator[tuple[int, ArchivedMessage]]]] = []
    opened = 0

    def open_next() -> None:
        nonlocal opened
        cov, path = pending[opened]
        opened += 1
        rows = _rows(cov, path, topic, start, end)
        first = next(rows, None)
        if first is not None:
            heapq.heappush(heap, (first[0], opened, first[1], rows))

    chunk: list[ArchivedMessage] = []
    previous = -1
    while heap or opened < len(pending):
        while opened < len(pending) and (not heap or pending[opened][0].start <= heap[0][0]):
            open_next()
        if not heap:
            continue
        offset, order, message, rows = heapq.heappop(heap)
        if offset == previous:
            msg = f"{topic}/{partition}: offset {offset} is in two archive files"
            raise ColdTierError(msg)
        previous = offset
        chunk.append(message)
        following = next(rows, None)
        if following is not None:
            heapq.heappush(heap, (following[0], order, following[1], rows))
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
