"""Records read back from archive files: in offset order over tables; files that cannot serve."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refold.processors.fold.archive import ArchiveTable, Coverage, RecordBytes, date_dir
from refold.processors.runtime.archive.cold_tier import (
    ArchiveGapError,
    ColdTierError,
    read_archived,
)
from refold.processors.runtime.archive.store import ArchiveStore

DAY = 1_767_225_600_000  # 2026-01-01


def _write(store: ArchiveStore, table_name: str, date: str, cov: Coverage, offsets: list[int]):
    raw = ArchiveTable.raw()
    table = ArchiveTable(table_name, raw.schema, None)
    rows = [
        table.row(
            {},
            (cov.topic, cov.partition, o, DAY + o, b"k%d" % o),
            0,
            RecordBytes(b"v%d" % o, (("h", b"x"),), 1),
        )
        for o in offsets
    ]
    return store.write(
        date_dir(store.root, table_name, date), cov, pa.Table.from_pylist(rows, raw.schema)
    )


def _offsets(chunks) -> list[int]:
    return [m.offset() for chunk in chunks for m in chunk]


def test_records_of_several_tables_and_dates_come_back_in_offset_order(tmp_path):
    store = ArchiveStore(tmp_path, fsync=False)
    first, second = Coverage("t", 0, 0, 10), Coverage("t", 0, 10, 20)
    _write(store, "OrderPlaced", "2026-01-01", first, [0, 3, 4, 8])
    _write(store, "OrderPaid", "2026-01-02", first, [1, 2, 9])
    _write(store, "_raw", "2026-01-01", first, [5, 6, 7])  # no event: kept raw
    _write(store, "OrderPlaced", "2026-01-01", second, [10, 12, 19])
    _write(store, "OrderPaid", "2026-01-01", second, [11, *range(13, 19)])
    _write(store, "OrderPaid", "2026-01-01", Coverage("t", 1, 0, 10), [0, 1])  # another partition
    store.ledger.update("t", 0, lambda c: c.add(0, 20))

    chunks = list(read_archived(tmp_path, "t", 0, 0, 20))
    assert _offsets(chunks) == list(range(20))
    message = chunks[0][5]
    assert (message.topic(), message.partition(), message.key(), message.value()) == (
        "t",
        0,
        b"k5",
        b"v5",
    )
    assert message.headers() == [("h", b"x")]
    assert message.timestamp() == (1, DAY + 5)
    assert message.error() is None
    assert _offsets(read_archived(tmp_path, "t", 0, 4, 12)) == list(range(4, 12))


def test_a_span_the_ledger_does_not_cover_is_refused_before_anything_is_read(tmp_path):
    store = ArchiveStore(tmp_path, fsync=False)
    _write(store, "OrderPaid", "2026-01-01", Coverage("t", 0, 0, 10), [0, 1])
    store.ledger.update("t", 0, lambda c: c.add(0, 10))
    with pytest.raises(ArchiveGapError, match=r"t/0: offsets 10\.\.14 are below the log start"):
        list(read_archived(tmp_path, "t", 0, 0, 15))


def test_a_file_that_disagrees_with_its_name_or_lacks_the_bytes_is_named(tmp_path):
    store = ArchiveStore(tmp_path, fsync=False)
    path = _write(store, "OrderPaid", "2026-01-01", Coverage("t", 0, 0, 10), [0, 11])
    store.ledger.update("t", 0, lambda c: c.add(0, 10))
    with pytest.raises(ColdTierError, match=rf"{path}: offsets 0\.\.11 are outside the range"):
        list(read_archived(tmp_path, "t", 0, 0, 10))

    table = pq.read_table(path).drop_columns(["kafka_value"])  # written before this change
    pq.write_table(table, path)
    with pytest.raises(ColdTierError, match=r"written before the archive kept each record's bytes"):
        list(read_archived(tmp_path, "t", 0, 0, 10))
