"""The command line every Python peer takes (the JVM peers take the same flags)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["FETCH", "parse"]

# The fetch settings of every librdkafka consumer here (refold's range reader's own defaults,
# processors/runtime/kafka_ranges.py): the Python peers get them too, not their own defaults
# (librdkafka's 1 s queue backoff, Quix's 100 ms). The JVM peers keep the Java client's
# defaults, which have no queue backoff.
FETCH = {"fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 10}


def parse(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """``--bootstrap --topic --ends P:END,... --progress FILE [--states FILE] [--redis-url URL]``.

    ``--states`` (in-memory variants): where to write the final states; ``--redis-url``
    (Redis variants): write each new state to Redis under ``--redis-prefix`` instead.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ends", required=True, help="partition:end offset, comma-separated")
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--states", type=Path)
    parser.add_argument("--redis-url")
    parser.add_argument("--redis-prefix", default="peers")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--addresses", default="", help="Bytewax: host:port of every process")
    parser.add_argument("--processes", type=int, default=2, help="refold's baseline: processes")
    parser.add_argument(
        "--tail",
        choices=("true", "false"),
        default="false",
        help="Bytewax, Flink: keep reading at the log's end until stopped (latency runs)",
    )
    args = parser.parse_args(argv)
    args.ends = {
        int(p): int(e) for p, e in (pair.split(":") for pair in args.ends.split(",") if pair)
    }
    return args
