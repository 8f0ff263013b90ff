"""Bytewax folding the order backlog: ``stateful_map`` per order, with recovery on.

Run in ``.venv-peers`` by :mod:`bench.peers.run`: one process per core, one worker each
(``cli_main`` with both addresses); Bytewax's Kafka source splits the partitions between the
workers and, with ``tail=False``, ends at the end of each partition, so the dataflow ends by
itself (``--tail true``, the latency run: it reads on until stopped). Recovery
(``--recovery``): Bytewax's snapshots of the state every epoch into a SQLite store per
partition (``python -m bytewax.recovery`` made them). The in-memory variant writes its states
at the end; the Redis variant writes each batch of new states with a pipeline.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import orjson
import redis
from bytewax import operators as op
from bytewax.connectors.kafka import KafkaSource, KafkaSourceMessage
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main

from bench.peers.args import parse
from bench.peers.report import OrderFold, Progress

_Folded = tuple[str, tuple[int, int, Any]]  # key, (partition, offset, state)


class _Partition(StatelessSinkPartition[_Folded]):
    def __init__(self, progress: Progress, client: redis.Redis | None, prefix: str) -> None:
        self.progress, self.client, self.prefix = progress, client, prefix

    def write_batch(self, items: list[_Folded]) -> None:
        if self.client is not None:
            pipe = self.client.pipeline(transaction=False)
            for key, (_p, _o, state) in items:
                if state is not None:
                    pipe.set(f"{self.prefix}:{key}", orjson.dumps(state))
            pipe.execute()
        for key, (partition, offset, state) in items:
            self.progress.seen(key, partition, offset, state)


class _Sink(DynamicSink[_Folded]):
    """Progress (and the Redis variant's writes) where the states come out of the fold."""

    def __init__(self, progress: Progress, redis_url: str | None, prefix: str) -> None:
        self.progress, self.redis_url, self.prefix = progress, redis_url, prefix

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        del step_id, worker_index, worker_count
        client = None if self.redis_url is None else redis.Redis.from_url(self.redis_url)
        return _Partition(self.progress, client, self.prefix)


def flow(args: Any, progress: Progress) -> Dataflow:
    """The dataflow: Kafka -> key by order -> stateful fold -> sink."""
    fold = OrderFold()
    dataflow = Dataflow("orders")
    source = KafkaSource(
        [args.bootstrap],
        [args.topic],
        tail=args.tail == "true",
        add_config={"fetch.queue.backoff.ms": "10"},
    )
    messages = op.input("kafka", dataflow, source)

    def keyed(message: KafkaSourceMessage[bytes, bytes]) -> tuple[str, tuple[int, int, bytes]]:
        return message.key.decode(), (message.partition, message.offset, message.value)

    def mapper(state: Any, record: tuple[int, int, bytes]) -> tuple[Any, tuple[int, int, Any]]:
        partition, offset, value = record
        new = fold(state, value)
        return new, (partition, offset, new)

    folded = op.stateful_map("fold", op.map("key", messages, keyed), mapper)
    op.output("out", folded, _Sink(progress, args.redis_url, args.redis_prefix))
    return dataflow


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse(__doc__ or "", argv)
    progress = Progress(args.progress, args.ends, keep_states=args.states is not None)
    recovery = args.work_dir / "recovery"
    cli_main(
        flow(args, progress),
        workers_per_process=1,
        process_id=args.process_id,
        addresses=args.addresses.split(",") if args.addresses else None,
        epoch_interval=timedelta(seconds=1),
        recovery_config=RecoveryConfig(str(recovery)) if recovery.exists() else None,
    )
    progress.write()
    if args.states is not None:
        progress.dump_states(args.states)
    return 0


if __name__ == "__main__":
    sys.exit(main())
