"""Read a Parquet archive back and compare it with the log, event for event."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError
from refold.processors.fold.archive import META_COLUMNS, ArchiveTable
from refold.processors.fold.records import SourceRecord
from refold.processors.runtime.kafka_ranges import read_log

__all__ = ["archive_rows", "assert_archive_equals_log", "log_events", "normalise"]

Key = tuple[str, int, int]
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_META = {f.name for f in META_COLUMNS}


def normalise(value: Any) -> Any:
    """Arrow's Python values as the decoder gives them: epoch ms for timestamps, days for dates."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return (aware - _EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(value, dt.date):
        return (value - _EPOCH.date()).days
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def archive_rows(root: Path) -> dict[Key, tuple[str, str, dict[str, Any]]]:
    """Every row of every table, by ``(topic, partition, offset)``: (type, event_date, row).

    Read with ``pyarrow.dataset`` and Hive partitioning, as a user would.

    Raises:
        AssertionError: An event is in the archive twice.
    """
    out: dict[Key, tuple[str, str, dict[str, Any]]] = {}
    if not root.is_dir():
        return out
    for table_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name[:1] not in "._"):
        dataset = ds.dataset(table_dir, format="parquet", partitioning="hive")
        for row in dataset.to_table().to_pylist():
            key = (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"])
            assert key not in out, f"{key} is in the archive twice ({table_dir.name})"
            date = str(row.pop("event_date"))
            out[key] = (table_dir.name, date, row)
    return out


def log_events(
    bootstrap: str, topics: Iterable[str], codec: EventCodec | None = None
) -> dict[Key, tuple[str, dict[str, Any], SourceRecord]]:
    """Every decodable record of ``topics``, by ``(topic, partition, offset)``."""
    codec = codec or EventCodec()
    out: dict[Key, tuple[str, dict[str, Any], SourceRecord]] = {}
    for topic in topics:
        for chunk in read_log({"bootstrap.servers": bootstrap}, topic):
            for message in chunk:
                record = SourceRecord.of_message(message)
                try:
                    event = codec.decode(record.value)
                except DeserializationError:
                    continue
                out[record.topic, record.partition, record.offset] = (
                    event.event_type,
                    event.data,
                    record,
                )
    return out


def assert_archive_equals_log(
    root: Path,
    bootstrap: str,
    topics: Iterable[str],
    upto: Mapping[tuple[str, int], int] | None = None,
    dates: Mapping[str, Any] | None = None,
) -> int:
    """The archive holds exactly the log's decodable events (below ``upto``), values equal.

    Args:
        root: The archive.
        bootstrap: The broker.
        topics: The archived topics.
        upto: Per partition, the offset the archive is compared up to (default: the log end).
        dates: The archive's ``EventTime`` of dates, to check each row's ``event_date``.

    Returns:
        How many events were compared.
    """
    codec = EventCodec()
    logged = log_events(bootstrap, topics, codec)
    if upto is not None:
        logged = {k: v for k, v in logged.items() if k[2] < upto.get((k[0], k[1]), 0)}
    archived = archive_rows(root)
    missing = sorted(set(logged) - set(archived))[:5]
    extra = sorted(set(archived) - set(logged))[:5]
    assert not missing, f"missing from the archive: {missing}"
    assert not extra, f"in the archive, not in the log: {extra}"
    tables: dict[str, ArchiveTable] = {}
    for key, (event_type, data, record) in logged.items():
        table_name, date, row = archived[key]
        assert table_name == event_type, key
        fields = {k: normalise(v) for k, v in row.items() if k not in _META}
        assert fields == data, key
        assert row["kafka_key"] == record.key, key
        assert normalise(row["kafka_timestamp"]) == (record.timestamp or None), key
        if dates is not None:
            table = tables.get(event_type)
            if table is None:
                table = tables[event_type] = ArchiveTable.of(
                    codec.reader_for(event_type).raw, dates
                )
            assert date == table.date_of(data, record.timestamp), key
    return len(logged)
