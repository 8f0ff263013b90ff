"""The sales_native transform: Spark's own event-time window over the decoded payments.

Each row is a window's result in the shape sales_windows emits (``window``, ``group``,
``start``, ``end``, ``count``, ``sum:``/``min:``/``max:``/``avg:amount_minor``), keyed
``<currency>:<start ms>``. In update mode every micro-batch upserts the windows it changed, so a
row is final once Spark's watermark (the newest ``paid_at`` seen minus 30 s, moved at the end of
each batch) has passed its end; a payment for a window already past the watermark is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from refold.contracts.processors import ProcessorOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SalesNative", "build"]

WINDOW = "per_minute"


class SalesNative:
    """Sales per currency per minute (count, sum, minimum, maximum and average amount)."""

    name = "sales_native"
    table = WINDOW
    event_types = ("OrderPaid",)
    output_mode = "update"
    # As sales_windows' lateness: payments arrive in order per order, orders interleave within
    # seconds.
    watermark_delay = "30 seconds"

    def transform(self, events: DataFrame) -> DataFrame:
        """Windows of one minute of ``paid_at`` per currency (driver side: builds the plan)."""
        from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

        start = F.unix_millis(F.col("window.start"))
        return (
            events.withWatermark("paid_at", self.watermark_delay)
            .groupBy(F.window("paid_at", "1 minute"), F.col("currency"))
            .agg(
                F.count(F.lit(1)).alias("count"),
                F.sum("amount_minor").alias("sum"),
                F.min("amount_minor").alias("min"),
                F.max("amount_minor").alias("max"),
            )
            .select(
                F.concat_ws(":", F.col("currency"), start.cast("string")).alias("key"),
                F.lit(WINDOW).alias("window"),
                F.col("currency").alias("group"),
                start.alias("start"),
                F.unix_millis(F.col("window.end")).alias("end"),
                F.col("count"),
                F.col("max").alias("max:amount_minor"),
                F.col("min").alias("min:amount_minor"),
                F.col("sum").alias("sum:amount_minor"),
                (F.col("sum") / F.col("count")).alias("avg:amount_minor"),
            )
        )


def build(options: ProcessorOptions) -> SalesNative:
    """The processor (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return SalesNative()
