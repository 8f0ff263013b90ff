"""``replay``: rebuild a processor's state from the log into a new generation, online.

Dry run by default: prints the per-partition plan. ``--execute`` builds the new generation while
the live one keeps serving readers, waits until it has caught up, then flips readers to it.
"""

from __future__ import annotations

import argparse
import sys

import redis
from tqdm import tqdm

from contracts.errors import RefoldError
from contracts.logconfig import configure_logging
from contracts.processors import PROCESSORS, processor_spec
from replay.config import ReplaySettings
from replay.plan import FromOffset, ResetSpec, ToEarliest, parse_scope
from replay.rebuild import plan_replay, run_rebuild

__all__ = ["build_parser", "main"]


def _offset(value: str) -> int:
    number = int(value)
    if number < 0:
        msg = f"offsets are >= 0, got {number}"
        raise argparse.ArgumentTypeError(msg)
    return number


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="replay",
        description="Rebuild a processor's state by folding the log again into a new "
        "generation, while the live generation keeps serving readers. Dry run by default.",
        epilog="examples:\n"
        "  replay --processor order_state --to-earliest            # show the plan\n"
        "  replay --processor order_state --to-earliest --execute  # rebuild and cut over\n"
        "  replay --processor order_state --from-offset 5000 --topic commerce.orders:0,1\n"
        "Settings come from REFOLD_* variables (REFOLD_KAFKA__BOOTSTRAP_SERVERS, "
        "REFOLD_REDIS__URL, REFOLD_STATE_DIR, REFOLD_LAG_THRESHOLD).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--processor", required=True, choices=sorted(PROCESSORS), help="the processor to rebuild"
    )
    spec = parser.add_mutually_exclusive_group(required=True)
    spec.add_argument(
        "--to-earliest",
        action="store_true",
        help="rebuild from the first retained offset (full rebuild)",
    )
    spec.add_argument(
        "--from-offset",
        "--to-offset",
        dest="from_offset",
        type=_offset,
        metavar="N",
        help="rebuild from offset N of every partition in scope",
    )
    parser.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P]",
        help="limit the reset to a topic or some of its partitions "
        "(repeatable; default: all topics of the processor)",
    )
    parser.add_argument(
        "--execute", action="store_true", help="build the new generation and cut readers over to it"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, json_lines=False)
    settings = ReplaySettings()
    spec = processor_spec(args.processor)
    reset: ResetSpec = ToEarliest() if args.to_earliest else FromOffset(args.from_offset)
    try:
        client = redis.Redis.from_url(settings.redis.url)
        plan = plan_replay(
            spec, reset, settings.kafka, client, settings.redis.key_prefix, parse_scope(args.topic)
        )
        print(plan.render())
        if not args.execute:
            print("\ndry run: nothing changed. Add --execute to rebuild and cut over.")
            return 0
        with tqdm(
            total=plan.total_events,
            unit="ev",
            desc=f"rebuilding {spec.name}",
            disable=args.no_progress,
            dynamic_ncols=True,
        ) as bar:

            def _progress(done: int, total: int) -> None:
                bar.total = total
                bar.n = done
                bar.refresh()

            result = run_rebuild(
                plan,
                spec,
                settings.kafka,
                settings.redis,
                state_dir=settings.state_dir,
                lag_threshold=settings.lag_threshold,
                max_rounds=settings.max_rounds,
                on_progress=_progress,
            )
    except (RefoldError, redis.RedisError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    previous = "none" if result.previous is None else f"g{result.previous}"
    print(
        f"\ng{result.generation} built from {result.events} records in {result.seconds:.1f}s "
        f"({result.rounds} round(s)); readers now see g{result.generation} "
        f"(previous: {previous}, kept as retired).\n"
        f"Restart the live processor (`refold process {spec.name}`) so it continues "
        f"g{result.generation} from its checkpoint."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
