"""``refold dlq list``, ``export``, ``redrive``: a processor's dead letters, counted or sent back.

Reads the dead-letter index a generation keeps in Redis (``dl:letters``: every letter it
decided, with its reason; see :mod:`refold.processors.runtime.dead_letter_index`), the live
generation's by default. The letters themselves, with their error and headers, are on the
processor's dead-letter topic: ``refold tail <processor>.dlq``, or the topic its
``REFOLD_<PROCESSOR>__DEAD_LETTER_TOPIC`` option names. ``redrive`` reads them there and sends
the selected records back to their topic, once (:mod:`refold.deploy.dlq_redrive`). Settings:
``REFOLD_REDIS__*``, ``REFOLD_KAFKA__*`` and the processor's options. This module is the only
one that reads the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import cast

import redis

from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import ContractError, RefoldError
from refold.contracts.layout import StateLayout
from refold.contracts.registry import default_registry
from refold.contracts.settings import StackSettings
from refold.contracts.store.connect import redis_client, unreachable
from refold.contracts.store.credentials import redis_refused
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.scan import SCAN_COUNT
from refold.contracts.topics import dead_letter_topic
from refold.deploy.dlq_redrive import Letter, Redriver, RedriveReport, Selection, read_letters
from refold.processors.runtime.dead_letter_index import summarise_index

__all__ = ["build_parser", "dead_letter_topic_of", "main"]

_EXAMPLES = """examples:
  refold dlq list --processor order_state
  refold dlq list --processor order_state --generation 2 --examples 10 --json
  refold dlq export --processor order_state --generation 2 --out letters.jsonl   # every one
  refold tail order_state.dlq -n 20        # the letters themselves: error, origin, headers

  refold dlq redrive --processor order_state --reason bad-body --dry-run
  refold dlq redrive --processor order_state --reason bad-body
  refold dlq redrive --processor order_state --topic orders --partition 3 --from-offset 1200

A rebuild sends a dead letter only if the live generation did not send it for the same record
and reason, so each generation's list is what it decided, and the topic holds each letter once.
Settings: REFOLD_REDIS__URL, REFOLD_REDIS__USERNAME, REFOLD_REDIS__PASSWORD,
REFOLD_REDIS__KEY_PREFIX, REFOLD_KAFKA__BOOTSTRAP_SERVERS (redrive);
REFOLD_<PROCESSOR>__DEAD_LETTER_TOPIC when the processor has one.
"""

_REDRIVE = """examples:
  refold dlq redrive --processor order_state --reason bad-body --dry-run   # what would be sent
  refold dlq redrive --processor order_state --reason bad-body --reason rejected
  refold dlq redrive --processor order_state --topic orders --partition 3 \\
      --from-offset 1200 --to-offset 1300
  refold dlq redrive --processor order_state --all

Each selected record goes back to its topic and partition with its key, value and headers
byte for byte, as a new record, once: a second redrive of it sends nothing (remembered in
Redis, <prefix>:<processor>:dlq:redriven). Every processor reading that topic reads the copy:
one that applied the original applies it again unless it de-duplicates by event id.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``refold dlq`` command line."""
    parser = CommandParser(
        prog="refold dlq",
        description="A processor's dead letters: by reason and origin, and sent back after a fix.",
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
    export = sub.add_parser(
        "export",
        help="write every dead letter a generation decided, one JSON line each",
        description=(
            "Write every dead letter a generation decided (its origin and reason), one JSON\n"
            "object a line, to --out or standard output; progress goes to standard error."
        ),
        epilog="examples:\n  refold dlq export --processor order_state --out letters.jsonl\n"
        "  refold dlq export --processor order_state --generation 2 | grep '\"late\"'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("--processor", required=True, help="processor name")
    export.add_argument(
        "--generation", type=int, help="generation (default: the live one)", metavar="N"
    )
    export.add_argument("--out", metavar="FILE", help="the JSON lines file (default: stdout)")
    _redrive_arguments(
        sub.add_parser(
            "redrive",
            help="send selected dead letters' records back to their topic, once",
            description=(
                "Send the records of a processor's selected dead letters back to their topic,\n"
                "once, after a fix. Select by reason and/or origin, or --all."
            ),
            epilog=_REDRIVE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def _redrive_arguments(redrive: argparse.ArgumentParser) -> None:
    redrive.add_argument("--processor", required=True, help="processor name")
    redrive.add_argument(
        "--reason", action="append", default=[], help="a letter's reason (repeatable)"
    )
    redrive.add_argument("--topic", help="the records' topic")
    redrive.add_argument("--partition", type=int, metavar="N", help="their partition")
    redrive.add_argument("--from-offset", type=int, metavar="A", help="their offset >= A")
    redrive.add_argument("--to-offset", type=int, metavar="B", help="their offset <= B")
    redrive.add_argument("--all", action="store_true", help="every letter of the processor")
    redrive.add_argument(
        "--dry-run", action="store_true", help="print what would be sent; send nothing"
    )
    redrive.add_argument("--json", action="store_true", help="the outcome as JSON")


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


def _generation(args: argparse.Namespace, registry: GenerationRegistry, command: str) -> int | None:
    """The generation the command reads (``--generation``, else the live one); None: said."""
    generation = args.generation if args.generation is not None else registry.live()
    if generation is None or registry.status(generation) is None:
        which = "no live generation" if generation is None else f"no generation {generation}"
        print(f"refold dlq {command}: {args.processor} has {which}", file=sys.stderr)
        return None
    return generation


def _index_entries(
    client: redis.Redis, registry: GenerationRegistry, generation: int
) -> Iterator[tuple[str, str]]:
    """A generation's dead-letter index, ``(origin, reason)``, read with SCAN."""
    for keys in registry.keys(generation).each_shard():  # sharded: each shard's letters
        for field, reason in client.hscan_iter(keys.dead_letters, count=SCAN_COUNT):
            yield cast("bytes", field).decode(), cast("bytes", reason).decode()


# Letters between two progress lines of an export.
_PROGRESS_EVERY = 50_000


def _export(args: argparse.Namespace, client: redis.Redis, prefix: str, topic: str) -> int:
    registry = GenerationRegistry(client, StateLayout(args.processor, prefix))
    generation = _generation(args, registry, "export")
    if generation is None:
        return 1
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    count = 0
    try:
        for origin, reason in _index_entries(client, registry, generation):
            line = {"origin": origin, "reason": reason, "generation": generation}
            out.write(json.dumps(line) + "\n")
            count += 1
            if count % _PROGRESS_EVERY == 0:
                print(f"refold dlq export: {count} letters...", file=sys.stderr, flush=True)
    finally:
        if out is not sys.stdout:
            out.close()
    where = args.out or "stdout"
    print(
        f"refold dlq export: {count} dead letter(s) of {args.processor} generation "
        f"{generation} to {where} (the records: refold tail {topic})",
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace, client: redis.Redis, prefix: str, topic: str) -> int:
    layout = StateLayout(args.processor, prefix)
    registry = GenerationRegistry(client, layout)
    generation = _generation(args, registry, "list")
    if generation is None:
        return 1
    entries = dict(_index_entries(client, registry, generation))
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


# Records a dry run lists before it only counts the rest (--json lists them all).
_DRY_RUN_LINES = 100


def _selection(args: argparse.Namespace) -> Selection | str:
    """The letters to redrive, or why the arguments select none."""
    by_origin = (args.partition, args.from_offset, args.to_offset)
    if any(v is not None for v in by_origin) and args.topic is None:
        return "--partition, --from-offset and --to-offset need --topic"
    if not (args.all or args.reason or args.topic):
        return "say which letters: --reason R, --topic T (and --partition, --from-offset...), --all"
    return Selection(
        args.processor,
        frozenset(args.reason),
        args.topic,
        args.partition,
        args.from_offset,
        args.to_offset,
    )


def _known(processor: str, client: redis.Redis, layout: StateLayout) -> bool:
    """Whether ``processor`` is installed here or has generations in Redis."""
    try:
        default_registry().processor(processor)
    except ContractError:
        return bool(client.exists(layout.generations))
    return True


def _letter_json(letter: Letter) -> dict[str, object]:
    return {"origin": letter.origin, "reason": letter.reason, "generation": letter.generation}


def _print_redrive(
    args: argparse.Namespace, topic: str, report: RedriveReport, selected: str
) -> None:
    skipped = {
        "already_redriven": report.already,
        "timer_letters": report.timers,
        "without_record_headers": report.unknown_headers,
    }
    if args.json:
        body = {
            "processor": args.processor,
            "topic": topic,
            "dry_run": args.dry_run,
            "letters_read": report.read,
            "matched": report.matched,
            "sent" if not args.dry_run else "would_send": [_letter_json(x) for x in report.sent],
            "skipped": skipped,
            "derived": report.derived,
        }
        print(json.dumps(body))
        return
    verb = "would redrive" if args.dry_run else "redrove"
    print(
        f"{args.processor}: {verb} {len(report.sent)} record(s) to their topic "
        f"({report.matched} of {report.read} letter(s) on {topic} match {selected})"
    )
    if args.dry_run:
        for letter in report.sent[:_DRY_RUN_LINES]:
            print(f"  {letter.origin}  {letter.reason}  (letter of g{letter.generation})")
        if len(report.sent) > _DRY_RUN_LINES:
            print(f"  ... and {len(report.sent) - _DRY_RUN_LINES} more (--json lists them all)")
    notes = {
        "already_redriven": "already redriven, not sent again",
        "timer_letters": "describe a failing timer (the record was applied): never redriven",
        "without_record_headers": (
            "do not carry their record's headers (sent before refold kept them, or by a "
            "source of Spark rows): not redriven"
        ),
    }
    for name, count in skipped.items():
        if count:
            print(f"  {count} {notes[name]}")
    if report.derived:
        print(
            f"  {report.derived} are another processor's outputs (refold.origin.id): a fold "
            "processor whose origin mark passed them skips them; replay the upstream instead"
        )


def redrive_command(
    args: argparse.Namespace,
    client: redis.Redis,
    prefix: str,
    topic: str,
    kafka: Mapping[str, str],
) -> int:
    """``refold dlq redrive``: 0 done (or nothing left to send), 1 nothing matches or an error."""
    selection = _selection(args)
    if isinstance(selection, str):
        print(f"refold dlq redrive: {selection}", file=sys.stderr)
        return 2
    layout = StateLayout(args.processor, prefix)
    if not _known(args.processor, client, layout):
        print(
            f"refold dlq redrive: unknown processor {args.processor}: no installed package "
            f"registers it and Redis has no generation of it under the prefix {prefix!r}",
            file=sys.stderr,
        )
        return 1

    def progress(line: str) -> None:
        print(f"refold dlq redrive: {line}", file=sys.stderr, flush=True)

    try:
        letters = read_letters(kafka, topic, progress)
        report = Redriver(kafka, client, layout, progress).run(
            letters, selection, dry_run=args.dry_run
        )
    except (RefoldError, RuntimeError) as exc:  # RuntimeError: a read of the topic failed
        print(f"refold dlq redrive: {exc}", file=sys.stderr)
        return 1
    selected = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if k in ("topic", "partition", "from_offset", "to_offset") and v is not None
    )
    selected = " ".join([*(f"--reason {r}" for r in args.reason), selected]).strip() or "--all"
    if report.matched == 0:
        print(
            f"refold dlq redrive: no dead letter of {args.processor} on {topic} matches "
            f"{selected} ({report.read} letter(s) read). `refold dlq list --processor "
            f"{args.processor}` counts them by reason.",
            file=sys.stderr,
        )
        return 1
    _print_redrive(args, topic, report, selected)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code.

    1: nothing to list or redrive, Redis or Kafka refused, or the processor's options are
    invalid; 2: usage.
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
        if args.command == "redrive":
            kafka = settings.kafka.as_librdkafka()
            return redrive_command(args, client, settings.redis.key_prefix, topic, kafka)
        if args.command == "export":
            return _export(args, client, settings.redis.key_prefix, topic)
        return _list(args, client, settings.redis.key_prefix, topic)
    except redis.AuthenticationError as exc:
        print(f"refold dlq: {redis_refused('refold dlq', client, exc)}", file=sys.stderr)
        return 1
    except redis.ConnectionError as exc:
        print(f"refold dlq: {unreachable(exc)}", file=sys.stderr)
        return 1
    finally:
        client.close()
