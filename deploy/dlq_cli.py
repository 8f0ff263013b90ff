"""``refold dlq list``: a processor's dead letters by reason and origin.

Reads the dead-letter index a generation keeps in Redis (``dl:letters``: every letter it
decided, with its reason; see :mod:`refold.processors.runtime.dead_letter_index`), the live
generation's by default. The letters themselves, with their error and headers, are on the
processor's dead-letter topic: ``refold tail <processor>.dlq``, or the topic its
``REFOLD_<PROCESSOR>__DEAD_LETTER_TOPIC`` option names. Settings: ``REFOLD_REDIS__*`` and the
processor's options. This module is the only one that reads the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import cast

import redis

from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import ContractError, RefoldError
from refold.contracts.layout import StateLayout
from refold.contracts.registry import default_registry
from refold.contracts.settings import StackSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.credentials import redis_refused
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.scan import SCAN_COUNT
from refold.contracts.topics import dead_letter_topic
from refold.processors.runtime.dead_letter_index import summarise_index

__all__ = ["build_parser", "dead_letter_topic_of", "main"]

_EXAMPLES = """examples:
  refold dlq list --processor order_state
  refold dlq list --processor order_state --generation 2 --examples 10 --json
  refold tail order_state.dlq -n 20        # the letters themselves: error, origin, headers

A rebuild sends a dead letter only if the live generation did not send it for the same record
and reason, so each generation's list is what it decided, and the topic holds each letter once.
Settings: REFOLD_REDIS__URL, REFOLD_REDIS__USERNAME, REFOLD_REDIS__PASSWORD,
REFOLD_REDIS__KEY_PREFIX; REFOLD_<PROCESSOR>__DEAD_LETTER_TOPIC when the processor has one.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``refold dlq`` command line."""
    parser = CommandParser(
        prog="refold dlq",
        description="A processor's dead letters, by reason and origin.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser(
        "list",
        help="count a generation's dead letters per reason, with their first origins",
        description="Count a generation's dead letters per reason, with their first origins.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("--processor", required=True, help="processor name")
    listing.add_argument(
        "--generation", type=int, help="generation (default: the live one)", metavar="N"
    )
    listing.add_argument(
        "--examples", type=int, default=3, metavar="N", help="origins shown per reason (3)"
    )
    listing.add_argument("--json", action="store_true", help="as JSON")
    return parser


def dead_letter_topic_of(processor: str, environ: Mapping[str, str]) -> str:
    """The dead-letter topic of ``processor`` as it runs with ``environ``'s options.

    A processor no installed package registers (its Redis state read from elsewhere) has the
    default ``<processor>.dlq``: its options cannot be read without its spec.

    Raises:
        ProcessorConfigError: The processor's options are invalid.
    """
    from refold.processors.runtime.cli import configured_dead_letter_topic

    try:
        spec = default_registry().processor(processor)
    except ContractError:  # unknown here, or no registry: the name alone decides
        return dead_letter_topic(processor)
    return configured_dead_letter_topic(spec, environ)


def _list(args: argparse.Namespace, client: redis.Redis, prefix: str, topic: str) -> int:
    layout = StateLayout(args.processor, prefix)
    registry = GenerationRegistry(client, layout)
    generation = args.generation if args.generation is not None else registry.live()
    if generation is None or registry.status(generation) is None:
        which = "no live generation" if generation is None else f"no generation {generation}"
        print(f"refold dlq list: {args.processor} has {which}", file=sys.stderr)
        return 1
    entries = {
        cast("bytes", field).decode(): cast("bytes", reason).decode()
        for field, reason in client.hscan_iter(
            layout.generation(generation).dead_letters, count=SCAN_COUNT
        )
    }
    summaries = summarise_index(entries, args.examples)
    if args.json:
        print(
            json.dumps(
                {
                    "processor": args.processor,
                    "topic": topic,
                    "generation": generation,
                    "status": registry.status(generation),
                    "letters": len(entries),
                    "reasons": [asdict(s) for s in summaries],
                }
            )
        )
        return 0
    status = registry.status(generation)
    print(
        f"{args.processor} generation {generation} ({status}): {len(entries)} dead letter(s) "
        f"decided (the records: refold tail {topic})"
    )
    if summaries:
        width = max(len(s.reason) for s in summaries)
        print(f"  {'reason':<{width}}  {'count':>7}  first origins")
        for s in summaries:
            print(f"  {s.reason:<{width}}  {s.count:>7}  {', '.join(s.first)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code.

    1: nothing to list, Redis refused, or the processor's options are invalid; 2: usage.
    """
    args = build_parser().parse_args(argv)
    settings = StackSettings()
    try:
        topic = dead_letter_topic_of(args.processor, os.environ)
    except RefoldError as exc:
        print(f"refold dlq: {exc}", file=sys.stderr)
        return 1
    client = redis_client(settings.redis.client_url())
    try:
        return _list(args, client, settings.redis.key_prefix, topic)
    except redis.AuthenticationError as exc:
        print(f"refold dlq: {redis_refused('refold dlq', client, exc)}", file=sys.stderr)
        return 1
    except redis.ConnectionError as exc:
        print(f"refold dlq: cannot reach Redis ({exc})", file=sys.stderr)
        return 1
    finally:
        client.close()
