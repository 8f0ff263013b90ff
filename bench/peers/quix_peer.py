"""Quix Streams folding the order backlog: RocksDB state, exactly-once processing.

Run in ``.venv-peers`` by :mod:`bench.peers.run`, one process per core in one consumer group.
Written as a Quix user would: a stateful ``apply`` per message key, refold's decoder and
order_state's rules inside; the Redis variant adds Quix's own ``RedisSink`` (a transaction
pipeline per checkpoint). SIGTERM stops the application (Quix's handler); then the in-memory
variant writes its states.
"""

from __future__ import annotations

import logging
import sys

import orjson
from quixstreams import Application, State, message_context
from quixstreams.sinks.community.redis import RedisSink

from bench.peers.args import parse
from bench.peers.report import OrderFold, Progress


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse(__doc__ or "", argv)
    logging.getLogger("quixstreams").setLevel(logging.WARNING)
    progress = Progress(args.progress, args.ends, keep_states=args.states is not None)
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.work_dir / f"state-{args.process_id}",
        commit_interval=1.0,  # the default 5 s would add up to 5 s to the end of the run
        loglevel="WARNING",
    )
    topic = app.topic(args.topic, key_deserializer="str", value_deserializer="bytes")
    sdf = app.dataframe(topic)
    fold = OrderFold()

    def apply(value: bytes, key: str, _ts: int, _headers: object, state: State) -> object:
        context = message_context()
        new = fold(state.get("order"), value)
        if new is not None:
            state.set("order", new)
        progress.seen(key, context.partition, context.offset, new)
        return new

    sdf = sdf.apply(apply, stateful=True, metadata=True).filter(lambda state: state is not None)
    if args.redis_url is not None:
        host, port = args.redis_url.removeprefix("redis://").split("/")[0].split(":")
        sdf.sink(
            RedisSink(
                host,
                int(port),
                0,
                value_serializer=orjson.dumps,
                key_serializer=lambda key, _value: f"{args.redis_prefix}:{key}",
            )
        )
    app.run()
    progress.write()
    if args.states is not None:
        progress.dump_states(args.states)
    return 0


if __name__ == "__main__":
    sys.exit(main())
