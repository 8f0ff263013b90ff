"""The plain-Python baseline: one process per core, each assigned its own partitions.

Each process does the same exactly-once work as the Spark processor (consume -> decode -> fold ->
one guarded Redis transaction per chunk, through the same FoldWriter), without Spark.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter

__all__ = ["BaselineResult", "run_baseline"]

_CHUNK = 20_000  # records per FoldWriter.apply: one Redis transaction each


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """Events and wall time of the baseline run."""

    processes: int
    events: int
    seconds: float

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.events / self.seconds


def _worker(
    bootstrap: str,
    target: FoldTarget,
    ranges: list[tuple[str, int, int]],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    # The simulated anomalies are dead-lettered on purpose; one warning each would flood the table.
    logging.getLogger("refold.processors").setLevel(logging.ERROR)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "refold-bench-baseline",  # never joined: assign() only
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,  # the 1 s default throttles bulk reads ~8x
        }
    )
    writer = FoldWriter(target, OrderStateProjection())
    writer.connect()  # as the processor's workers do, while the records come
    ends = {(t, p): e for t, p, e in ranges}
    started = time.monotonic()
    consumer.assign([TopicPartition(t, p, 0) for t, p, _e in ranges])
    pending: list[SourceRecord] = []
    done = 0
    remaining = {tp for tp, e in ends.items() if e > 0}
    while remaining:
        for message in consumer.consume(10_000, timeout=0.5):
            if message.error() is not None:
                continue
            record = SourceRecord.of_message(message)
            pending.append(record)
            tp = (record.topic, record.partition)
            if record.offset + 1 >= ends[tp]:
                remaining.discard(tp)
        if len(pending) >= _CHUNK or (pending and not remaining):
            writer.apply(pending)
            done += len(pending)
            pending = []
    out.put((done, started, time.monotonic()))
    consumer.close()


def run_baseline(
    bootstrap: str, target: FoldTarget, ends: dict[tuple[str, int], int], processes: int
) -> BaselineResult:
    """Run ``processes`` workers over the partitions in ``ends`` until all are applied."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    shares: list[list[tuple[str, int, int]]] = [[] for _ in range(processes)]
    for index, ((topic, partition), end) in enumerate(sorted(ends.items())):
        shares[index % processes].append((topic, partition, end))
    workers = [
        context.Process(target=_worker, args=(bootstrap, target, share, out))
        for share in shares
        if share
    ]
    for worker in workers:
        worker.start()
    results: list[tuple[int, float, float]] = []
    while len(results) < len(workers):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:  # its traceback is on stderr; the others would wait forever
                for worker in workers:
                    worker.terminate()
                msg = f"a baseline worker failed (exit code {failed[0]})"
                raise RuntimeError(msg) from None
    for worker in workers:
        worker.join()
    events = sum(r[0] for r in results)
    seconds = max(r[2] for r in results) - min(r[1] for r in results)
    return BaselineResult(len(workers), events, seconds)
