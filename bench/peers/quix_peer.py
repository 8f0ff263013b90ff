"""Quix Streams folding the order backlog: RocksDB state, exactly-once processing.

Run in ``.venv-peers`` by :mod:`bench.peers.run`, one process per core in one consumer group.
Written as its docs show an app: Quix's defaults (a 5 s commit interval among them) but the
guarantee, ``exactly-once``, and the fetch settings every librdkafka engine here gets
(:data:`bench.peers.args.FETCH`); a stateful ``apply`` per message key with the decode a
Python user writes (:class:`bench.peers.report.OrderFold`). The Redis variant adds Quix's own
``RedisSink`` (a transaction pipeline per checkpoint). SIGTERM stops the application (Quix's
handler). The final states are read after the run from the store's changelog topics
(:func:`bench.peers.oracle.changelog_states`), not kept by the app.
"""

from __future__ import annotations

import logging
import sys

import orjson
from quixstreams import Application, State, message_context
from quixstreams.sinks.community.redis import RedisSink

from bench.peers.args import FETCH, parse
from bench.peers.report import OrderFold, Progress


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse(__doc__ or "", argv)
    logging.getLogger("quixstreams").setLevel(logging.WARNING)
    progress = Progress(args.progress, args.ends)
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.work_dir / f"state-{args.process_id}",
        consumer_extra_config=dict(FETCH),
        loglevel="WARNING",
    )
    topic = app.topic(args.topic, key_deserializer="str", value_deserializer="bytes")
    sdf = app.dataframe(topic)
    fold = OrderFold()

    def apply(value: bytes, _key: str, _ts: int, _headers: object, state: State) -> object:
        new = fold(state.get("order"), value)
        if new is not None:
            state.set("order", new)
        context = message_context()
        progress.seen(context.partition, context.offset)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
