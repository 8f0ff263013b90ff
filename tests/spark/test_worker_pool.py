"""A fold's tasks meet the same warm Python workers whichever way Spark runs them.

A fold's batch 0 runs as ``mapInArrow`` over the source's ranges, its later batches as an RDD job
the driver planned (``processors/runtime/sink.py``). Spark pools Python workers per daemon, one
daemon per environment; a session built by ``build_spark_session`` gives both kinds of job the
same environment, so both fork from one daemon and reuse its workers (with their Kafka and Redis
clients) rather than starting a second set at batch 1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
import pytest


def _daemon_of_rdd_tasks(spark) -> set[int]:
    def parent(_: int, rows: Iterator[int]) -> Iterator[int]:
        yield os.getppid()  # a worker's parent is the daemon that forked it

    return set(spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(parent).collect())


def _daemon_of_arrow_tasks(spark) -> set[int]:
    def parent(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"daemon": [os.getppid()]})

    frame = spark.range(2).repartition(2).mapInArrow(parent, "daemon long")
    return {row.daemon for row in frame.collect()}


@pytest.mark.timeout(300)
def test_rdd_jobs_and_map_in_arrow_fork_their_workers_from_one_daemon(spark):
    rdd = _daemon_of_rdd_tasks(spark)
    arrow = _daemon_of_arrow_tasks(spark)
    assert len(rdd) == 1
    assert arrow == rdd
