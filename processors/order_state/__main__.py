"""``python -m processors.order_state``: run the order-state processor (one generation)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from contracts.logconfig import configure_logging
from contracts.store.generations import checkpoint_root
from contracts.topics import ORDERS
from processors.order_state.config import OrderStateSettings
from processors.order_state.projection import OrderStateProjection
from processors.runtime.runner import (
    GenerationChoice,
    RunOptions,
    build_fingerprints,
    run_processor,
)

__all__ = ["main"]


def _generation(value: str) -> GenerationChoice:
    if value in ("live", "new"):
        return value  # type: ignore[return-value]
    try:
        return int(value)
    except ValueError:
        msg = f"expected live, new or a generation number, got {value!r}"
        raise argparse.ArgumentTypeError(msg) from None


def build_parser() -> argparse.ArgumentParser:
    """The processor's command line."""
    parser = argparse.ArgumentParser(
        prog="refold process order_state",
        description="Fold commerce.orders into per-order state and totals in Redis "
        "(a Spark Structured Streaming query). Settings come from REFOLD_* variables, e.g. "
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS, REFOLD_REDIS__URL, REFOLD_STATE_DIR.",
    )
    parser.add_argument(
        "--generation",
        type=_generation,
        default="live",
        help="live (default; the first run creates generation 1), new, or N",
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help='earliest | latest | Spark JSON {"topic":{"0":42}}; used only '
        "for a generation without checkpoint or applied positions",
    )
    parser.add_argument(
        "--available-now", action="store_true", help="process what is in the log now, then exit"
    )
    parser.add_argument(
        "--accept-code-change",
        action="store_true",
        help="resume a generation built by other code (records the new "
        "fingerprint) instead of refusing",
    )
    parser.add_argument(
        "--print-fingerprint",
        action="store_true",
        help="print this code's generation fingerprints as JSON and exit",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("REFOLD_LOG_LEVEL", "INFO"),
        help="DEBUG adds Spark's phase timings per batch (default: $REFOLD_LOG_LEVEL or INFO)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    if args.print_fingerprint:
        print(json.dumps(build_fingerprints(OrderStateProjection()), sort_keys=True))
        return 0
    configure_logging(args.log_level)
    settings = OrderStateSettings()
    options = RunOptions(
        generation=args.generation,
        checkpoint_root=checkpoint_root(settings.state_dir),
        starting_offsets=args.starting_offsets,
        available_now=args.available_now,
        trigger_interval=settings.trigger_interval,
        max_offsets_per_trigger=settings.max_offsets_per_trigger,
        max_tasks=settings.max_tasks,
        source_format=settings.source_format,
        dead_letter_topic=settings.dead_letter_topic,
        accept_code_change=args.accept_code_change,
    )
    topic = dataclasses.replace(ORDERS, name=settings.orders_topic)
    projection = OrderStateProjection(settings.notifications_topic)
    run_processor(projection, [topic], settings.kafka, settings.redis, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
