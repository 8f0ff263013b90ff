"""The archive engine: every event of its topics as Parquet files, the log's cold tier.

Each task writes the files of the ranges it reads and the driver commits them with the
positions (:class:`~refold.processors.runtime.archive.sink.ArchiveSink`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from refold.contracts.codec import EventCodec
from refold.processors.fold.archive import ArchiveProcessor, is_archive_processor
from refold.processors.fold.projection import Projection
from refold.processors.runtime.archive.sink import ArchiveSink, prepare_archive, start_archive_query
from refold.processors.runtime.engines.base import Engine, QueryStart

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


__all__ = ["ArchiveEngine"]


class ArchiveEngine(Engine):
    """An :class:`~refold.processors.fold.archive.ArchiveProcessor`.

    It has no entities (never re-keyed) and skips watermark markers itself. It is one lineage
    of files: code and schema changes never call for a rebuild (new files get the new columns;
    ``refold archive backfill`` rewrites old dates). Being the cold tier, its source never reads
    below the log start from the archive itself.
    """

    name = "archive"
    called = "an archive"
    skips_markers = True
    rebuilds_on_code_change = False
    reads_cold_tier = False

    def matches(self, projection: Projection) -> bool:
        """An :class:`~refold.processors.fold.archive.ArchiveProcessor`."""
        return is_archive_processor(projection)

    def start(self, start: QueryStart) -> tuple[ArchiveSink, StreamingQuery]:
        """Take ownership of the files, then wire the ranges source to the archive sink."""
        archive = cast("ArchiveProcessor", start.projection)
        target = start.run.target
        plan = prepare_archive(target, archive, EventCodec(), start.options.source_format)
        # The source's own grouping, as for a fold.
        sink = ArchiveSink(plan, start.mirror, start.run.checkpoint, start.task_plan())
        query = start_archive_query(
            start.source(),
            sink,
            start.query_name,
            start.run.checkpoint,
            start.options.trigger_interval,
        )
        return sink, query

    def exact_ends(self, source_format: str) -> bool:
        """Each range's end, but with refold's record source (its last record)."""
        return source_format != "refold_kafka"
