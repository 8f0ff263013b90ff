"""Bytewax folding the order backlog, written as its docs show a Kafka app.

Run in ``.venv-peers`` by :mod:`bench.peers.run`: one process per core, one worker each
(``cli_main`` with both addresses); Bytewax's Kafka source splits the partitions between the
workers and, with ``tail=False``, ends at the end of each partition, so the dataflow ends by
itself (``--tail true``, the latency run: it reads on until stopped). The consumer gets the
fetch settings every librdkafka engine here gets (:data:`bench.peers.args.FETCH`).

Two shapes:
- in memory: ``fold_final`` per order, which emits each order's final state when the input
  ends; the states are written to a file after that, outside the timed run. With recovery
  (``--work-dir``/recovery made by ``python -m bytewax.recovery``) Bytewax snapshots the fold's
  state into SQLite every epoch, its default 10 s.
- Redis (``--redis-url``): ``stateful_map`` per order and every new state written to Redis, a
  pipeline per batch, so another process can read it (the latency run).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import redis
from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSource, KafkaSourceMessage
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main

from bench.peers.args import FETCH, parse
from bench.peers.report import OrderFold, Progress, dump_states

_EPOCH = timedelta(seconds=10)  # bytewax.run's default epoch (and snapshot) interval
_Item = tuple[str, Any]


class _Partition(StatelessSinkPartition[_Item]):
    def __init__(self, write: Callable[[list[_Item]], None]) -> None:
        self.write = write

    def write_batch(self, items: list[_Item]) -> None:
        self.write(items)


class _Sink(DynamicSink[_Item]):
    def __init__(self, write: Callable[[list[_Item]], None]) -> None:
        self.write = write

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        del step_id, worker_index, worker_count
        return _Partition(self.write)


def _final_states(progress: Progress, states: dict[str, Any]) -> Callable[[list[_Item]], None]:
    """The in-memory shape's sink: the final states, once the input has ended."""

    def write(items: list[_Item]) -> None:
        if progress.done is None:
            progress.finished()
        states.update((key, state) for key, state in items if state is not None)

    return write


def _redis_writes(progress: Progress, url: str, prefix: str) -> Callable[[list[_Item]], None]:
    """The Redis shape's sink: each batch's new states in one pipeline."""
    client = redis.Redis.from_url(url)

    def write(items: list[_Item]) -> None:
        pipe = client.pipeline(transaction=False)
        last: dict[int, int] = {}
        for key, (partition, offset, state) in items:
            if state is not None:
                pipe.set(f"{prefix}:{key}", orjson.dumps(state))
            if offset > last.get(partition, -1):
                last[partition] = offset
        pipe.execute()
        progress.seen_batch(last)

    return write


def flow(args: Any, progress: Progress, states: dict[str, Any]) -> Dataflow:
    """The dataflow: Kafka -> key by order -> fold -> sink."""
    fold = OrderFold()
    dataflow = Dataflow("orders")
    source = KafkaSource(
        [args.bootstrap], [args.topic], tail=args.tail == "true", add_config=dict(FETCH)
    )
    messages = op.input("kafka", dataflow, source)
    if args.redis_url is None:

        def keyed(message: KafkaSourceMessage[bytes, bytes]) -> tuple[str, bytes]:
            if progress.first is None:
                progress.seen(message.partition, message.offset)
            return message.key.decode(), message.value

        final = op.fold_final("fold", op.map("key", messages, keyed), lambda: None, fold)
        op.output("out", final, _Sink(_final_states(progress, states)))
        return dataflow

    def record(message: KafkaSourceMessage[bytes, bytes]) -> tuple[str, tuple[int, int, bytes]]:
        return message.key.decode(), (message.partition, message.offset, message.value)

    def mapper(state: Any, value: tuple[int, int, bytes]) -> tuple[Any, tuple[int, int, Any]]:
        partition, offset, body = value
        new = fold(state, body)
        return new, (partition, offset, new)

    folded = op.stateful_map("fold", op.map("key", messages, record), mapper)
    op.output("out", folded, _Sink(_redis_writes(progress, args.redis_url, args.redis_prefix)))
    return dataflow


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse(__doc__ or "", argv)
    progress = Progress(args.progress, args.ends)
    states: dict[str, Any] = {}
    recovery: Path = args.work_dir / "recovery"
    cli_main(
        flow(args, progress, states),
        workers_per_process=1,
        process_id=args.process_id,
        addresses=args.addresses.split(",") if args.addresses else None,
        epoch_interval=_EPOCH,
        recovery_config=RecoveryConfig(str(recovery)) if recovery.exists() else None,
    )
    if args.states is not None:
        dump_states(args.states, states)
    return 0


if __name__ == "__main__":
    sys.exit(main())
