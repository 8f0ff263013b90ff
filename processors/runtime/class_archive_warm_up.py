"""The job whose JVM writes the class archive: the shapes a processor runs, without Kafka or Redis.

A Python streaming source (as a processor's Kafka source is), ``foreachBatch`` and
``mapInArrow`` (as a processor's sink), a few micro-batches with a checkpoint. Module-level, so
that Spark's Python workers import it (:mod:`refold.processors.runtime.class_archive`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

__all__ = ["warm_up"]

_BATCH_ROWS = 1_000
_WARM_UP_ROWS = 3 * _BATCH_ROWS


class _WarmUpPartition(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


class _WarmUpReader(DataSourceStreamReader):
    """Counts up by 1,000 a batch: a Python stream source, as a processor's Kafka source is."""

    def __init__(self) -> None:
        self._latest = 0

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's method name
        return {"n": 0}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's method name
        # A batch's worth more on each call, up to a few batches: then the query goes idle.
        self._latest = min(self._latest + _BATCH_ROWS, _WARM_UP_ROWS)
        return {"n": self._latest}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        middle = (start["n"] + end["n"]) // 2
        return [_WarmUpPartition(start["n"], middle), _WarmUpPartition(middle, end["n"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, _WarmUpPartition):
            raise TypeError(type(partition).__name__)
        yield pa.RecordBatch.from_pydict(
            {"n": pa.array(range(partition.start, partition.end), pa.int64())}
        )


class _WarmUpSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "refold_class_archive_warm_up"

    def schema(self) -> str:
        return "n long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return _WarmUpReader()


def _summed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    total = sum(pc.sum(b.column("n")).as_py() or 0 for b in batches)
    yield pa.RecordBatch.from_pydict({"total": pa.array([total], pa.int64())})


def _fold_batch(batch: Any, batch_id: int) -> None:
    batch.mapInArrow(_summed, "total long").collect()


def warm_up(session: Any, checkpoint: Path) -> None:
    """Run the shapes a processor runs until the source's few batches are done."""
    session.dataSource.register(_WarmUpSource)
    query = (
        session.readStream.format(_WarmUpSource.name())
        .load()
        .writeStream.foreachBatch(_fold_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
