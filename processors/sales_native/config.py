"""The sales_native processor as the platform sees it (``refold.processors`` entry point).

The Spark-native twin of sales_windows' ``per_minute`` window: ``OrderPaid`` events of
``commerce.orders`` per currency and minute of ``paid_at``, aggregated by Spark
(``withWatermark`` + ``window`` + ``groupBy``; state in the generation's checkpoint) and upserted
into the table ``per_minute`` by ``<currency>:<window start ms>``. It exists to compare the two
kinds (``python -m bench windows``) and as the reference of a DataFrame processor.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import ProcessorSpec

__all__ = ["SALES_NATIVE"]

SALES_NATIVE = ProcessorSpec(
    name="sales_native",
    projection="refold.processors.sales_native.projection:build",
    topics=(ORDERS.name,),
    # A DataFrame processor is never re-keyed (the driver writes each batch's rows): the key is
    # the topic's partition key, and the rows' keys come from the transform.
    key="order_id",
    tables=("per_minute",),
    description="paid sales per currency per minute, aggregated by Spark (DataFrame processor)",
)
