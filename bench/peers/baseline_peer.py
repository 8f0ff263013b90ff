"""refold's plain-Python baseline (bench/baseline.py) as a peer process, for its CPU and memory.

Runs in refold's venv; writes the progress file once, at the end (the baseline's workers time
themselves from their start to their last exactly-once Redis transaction).
"""

from __future__ import annotations

import sys
import time

from bench.baseline import run_baseline
from bench.peers.args import parse
from bench.peers.report import Progress
from refold.processors.runtime.envelope import FoldTarget


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--redis-url`` and ``--redis-prefix`` name the fold's target."""
    args = parse(__doc__ or "", argv)
    kafka = (("bootstrap.servers", args.bootstrap),)
    target = FoldTarget(
        "order_state", 1, args.redis_url, args.redis_prefix, kafka, f"{args.topic}.dlq"
    )
    ends = {(args.topic, p): e for p, e in args.ends.items()}
    result = run_baseline(args.bootstrap, target, ends, args.processes)
    ended = time.time()
    progress = Progress(args.progress, args.ends)
    progress.first = ended - result.seconds
    progress.offsets = {p: e - 1 for p, e in args.ends.items()}
    progress.reached = dict.fromkeys(args.ends, ended)
    progress.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
