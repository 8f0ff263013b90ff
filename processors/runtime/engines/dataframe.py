"""The DataFrame engine: the user's Spark transform, its rows upserted by the driver.

Each batch's rows are written in one Redis transaction with the batch id
(:class:`~refold.processors.runtime.dataframe.DataFrameSink`); lateness and aggregation state
are Spark's own (``withWatermark`` in the transform), kept in Spark's checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from refold.contracts.processors import EventTime
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.dataframe import DataFrameProcessor, is_dataframe_processor
from refold.processors.fold.projection import Projection
from refold.processors.fold.rekey import Keying
from refold.processors.runtime.dataframe import DataFrameSink, build_dataframe_query
from refold.processors.runtime.engines.base import Engine, QueryStart

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


__all__ = ["DataFrameEngine"]


class DataFrameEngine(Engine):
    """A :class:`~refold.processors.fold.dataframe.DataFrameProcessor` (it has a ``transform``).

    Its rows are written by the driver, one transaction per batch: its entities need no owner
    task, so it is never re-keyed. It skips watermark markers itself.
    """

    name = "dataframe"
    called = "a DataFrame processor"
    skips_markers = True
    state_in_checkpoint = True

    def matches(self, projection: Projection) -> bool:
        """A processor with a ``transform``."""
        return is_dataframe_processor(projection)

    def check_spec(
        self, projection: Projection, event_time: EventTime | None, keying: Keying | None
    ) -> None:
        """Refuse an event time: its lateness is Spark's."""
        if event_time is not None:
            msg = (
                f"{projection.name} is a DataFrame processor, whose lateness is Spark's "
                "(withWatermark in its transform), but its spec declares an event_time that "
                "nothing would apply. Operator action: remove event_time from its ProcessorSpec."
            )
            raise ProcessorConfigError(msg)

    def start(self, start: QueryStart) -> tuple[DataFrameSink, StreamingQuery]:
        """Wire source -> decode -> ``transform`` -> the driver's upsert."""
        frames = cast("DataFrameProcessor", start.projection)
        sink = DataFrameSink(start.run.target, frames.table, start.run.checkpoint, start.mirror)
        query = build_dataframe_query(
            start.source(), frames, sink, start.query_name, start.options.trigger_interval
        )
        return sink, query

    def exact_ends(self, source_format: str) -> bool:
        """Always: it records the batch's end offsets, whatever the source."""
        return True
