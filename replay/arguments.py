"""The ``replay`` command line: its parser, and the reset spec its ``plan`` options name.

The commands themselves: :mod:`refold.replay.plan_command` (``replay plan``) and
:mod:`refold.replay.admin_commands` (``status``, ``rollback``, ``gc``, ``snapshot``, ``diff``,
``check``); :mod:`refold.replay.__main__` dispatches to them.
"""

from __future__ import annotations

import argparse
import difflib
import os
from datetime import UTC, datetime
from pathlib import Path

from refold.contracts.cli_parser import CommandParser
from refold.contracts.logconfig import add_log_format_argument
from refold.contracts.registry import default_registry, with_fallback
from refold.replay.errors import PlanError
from refold.replay.reset_specs import (
    ByDuration,
    FromFile,
    FromOffset,
    ResetSpec,
    ShiftBy,
    ToCurrent,
    ToDatetime,
    ToEarliest,
    ToLatest,
    parse_datetime,
    parse_duration,
    parse_offsets_csv,
)

__all__ = ["build_parser", "parse_args", "reset_spec"]


def _offset(value: str) -> int:
    number = int(value)
    if number < 0:
        msg = f"offsets are >= 0, got {number}"
        raise argparse.ArgumentTypeError(msg)
    return number


_COMMANDS = ("plan", "status", "rollback", "gc", "diff", "check", "snapshot")


def _add_processor(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--processor", required=required, metavar="NAME", help=f"the processor ({_known()})"
    )


def _known() -> str:
    """The registered processors, for help texts."""
    empty: list[str] = []
    names = with_fallback(lambda: sorted(default_registry().processors), empty)
    return ", ".join(names) or "none registered"


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``replay [plan] ...``, ``status``, ``rollback``, ``gc``, ``diff``."""
    parser = CommandParser(
        prog="replay",
        description="Rebuild a processor's state by folding the log again into a new "
        "generation, while the live generation keeps serving readers.",
        epilog="examples:\n"
        "  replay --processor order_state --to-earliest            # show the plan (dry run)\n"
        "  replay --processor order_state --to-earliest --execute  # rebuild and cut over\n"
        "  replay --processor order_state --from-offset 5000 --topic commerce.orders:0,1\n"
        "  replay --processor order_state --until 2026-12-03T12:00:00Z --execute  # as of\n"
        "  replay status                                           # every generation\n"
        "  replay diff --processor order_state 1 2                 # compare two generations\n"
        "  replay rollback --processor order_state                 # flip readers back\n"
        "  replay gc --processor order_state --execute             # drop retired generations\n"
        "  replay check --processor order_state                    # deploy gate\n"
        "  replay snapshot --processor order_state                 # snapshot the live state\n"
        "`replay --processor ...` is short for `replay plan --processor ...`. Settings come from "
        "REFOLD_* variables (REFOLD_KAFKA__BOOTSTRAP_SERVERS, REFOLD_REDIS__URL, "
        "REFOLD_STATE_DIR, REFOLD_LAG_THRESHOLD, REFOLD_REPLAY_TIMEOUT_S). SIGTERM or SIGINT "
        "during --execute stops the rebuild's processor, leaves readers where they were and "
        "exits with 143 / 130.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="WARNING")
    add_log_format_argument(parser, os.environ)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan_command(sub)
    _add_generation_commands(sub)
    return parser


def _add_plan_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = sub.add_parser("plan", help="plan a rebuild (dry run) or run it with --execute")
    which = plan.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--processor",
        action="append",
        metavar="NAME",
        help="the processor (repeatable)",
    )
    which.add_argument("--all", action="store_true", help="every processor")
    _add_reset_specs(plan)
    until = plan.add_mutually_exclusive_group()
    until.add_argument(
        "--until",
        metavar="ISO-8601",
        help="state as of a moment: stop each partition before its first record after this "
        "time (a time zone is required) and keep the generation beside the live one, without "
        "a flip; the start is --to-earliest unless a reset option says otherwise",
    )
    until.add_argument(
        "--until-offsets",
        metavar="JSON|CSV",
        help='as --until, at explicit offsets: {"topic":{"0":42}} or topic,partition,offset '
        "lines (';' separates them too), every partition named",
    )
    plan.add_argument(
        "--allow-data-loss",
        action="store_true",
        help="start at the log start when a target's records are gone",
    )
    plan.add_argument(
        "--accept-dead-letters",
        action="store_true",
        help="do not fail the plan for records with unknown fingerprints or not in Avro "
        "(the rebuild sends them to the dead-letter topic)",
    )
    plan.add_argument(
        "--scan-limit",
        type=_offset,
        default=1_000_000,
        metavar="N",
        help="records whose writer schema is checked before the rebuild (default 1000000; "
        "0 skips the scan)",
    )
    plan.add_argument(
        "--export",
        action="store_true",
        help="print the targets as topic,partition,offset CSV (for --from-file "
        "and Kafka's own tool)",
    )
    plan.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P]",
        help="limit the reset to a topic or some of its partitions "
        "(repeatable; default: all topics of the processor)",
    )
    plan.add_argument(
        "--execute", action="store_true", help="build the new generation and cut readers over to it"
    )
    plan.add_argument(
        "--in-place",
        action="store_true",
        help="with --execute: the classic stop-the-world reset instead: rewind the live "
        "generation and its consumer group (refused while its processor runs; readers see the "
        "state emptied and refilled)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_reset_specs(plan: argparse.ArgumentParser) -> None:
    """Where the rebuild starts: exactly one reset spec (:mod:`refold.replay.reset_specs`)."""
    # Required unless --until names a moment (which starts from the earliest): parse_args.
    spec = plan.add_mutually_exclusive_group()
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
    spec.add_argument(
        "--to-latest", action="store_true", help="start at the log end (fold only new records)"
    )
    spec.add_argument(
        "--to-current", action="store_true", help="start where the live generation is now"
    )
    spec.add_argument(
        "--shift-by",
        type=int,
        metavar="±N",
        help="move the live generation's positions by N records",
    )
    spec.add_argument(
        "--to-datetime",
        metavar="ISO-8601",
        help="first record at or after this time; a time zone is required",
    )
    spec.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="first record at or after now minus this duration",
    )
    spec.add_argument(
        "--from-file", metavar="CSV", help="topic,partition,offset lines (Kafka's --export format)"
    )


def _add_generation_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    status = sub.add_parser("status", help="generations of every processor (or one)")
    _add_processor(status, required=False)
    status.add_argument("--json", action="store_true", help="print JSON")

    back = sub.add_parser(
        "rollback", help="flip readers back to the generation the live one replaced"
    )
    _add_processor(back)

    gc = sub.add_parser(
        "gc",
        help="remove retired and abandoned generations (dry run without --execute); as-of "
        "generations only when asked",
    )
    _add_processor(gc)
    gc.add_argument("--execute", action="store_true", help="really remove them")
    gc.add_argument(
        "--include-as-of",
        action="store_true",
        help="also remove every generation kept as of a moment (replay --until)",
    )
    gc.add_argument(
        "--generation",
        type=int,
        action="append",
        metavar="N",
        help="remove only these generations (repeatable; retired, abandoned or as of a moment)",
    )

    check = sub.add_parser(
        "check",
        help="deploy gate: does the deployed code need a rebuild? "
        "(exit 0 compatible, 5 rebuild needed)",
    )
    _add_processor(check)
    check.add_argument("--json", action="store_true", help="print JSON")

    snap = sub.add_parser(
        "snapshot",
        help="copy a generation's state and positions at one instant (the start of later "
        "rebuilds from an offset, a time or the current position)",
    )
    _add_processor(snap)
    snap.add_argument(
        "--generation", type=int, help="generation to snapshot (default: the live one)"
    )
    snap.add_argument("--list", action="store_true", help="list snapshots instead")
    snap.add_argument("--json", action="store_true", help="print JSON")

    diff = sub.add_parser("diff", help="compare two generations key by key")
    _add_processor(diff)
    diff.add_argument("a", type=int, help="generation A")
    diff.add_argument("b", type=int, help="generation B")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, accepting ``replay --processor ...`` for ``replay plan --processor ...``."""
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS:
        close = difflib.get_close_matches(argv[0], sorted(_COMMANDS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unknown command {argv[0]!r}{hint}; commands: {', '.join(_COMMANDS)}")
    if argv and argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["plan", *argv]
    args = parser.parse_args(argv)
    if args.command == "plan" and not _names_spec(args) and not (args.until or args.until_offsets):
        parser.error(
            "replay plan needs where to start: one of --to-earliest, --from-offset, --to-latest, "
            "--to-current, --shift-by, --to-datetime, --by-duration, --from-file (or --until / "
            "--until-offsets, which start from the earliest)"
        )
    return args


def _names_spec(args: argparse.Namespace) -> bool:
    """Whether ``replay plan``'s options name a reset spec."""
    return bool(
        args.to_earliest
        or args.to_latest
        or args.to_current
        or args.shift_by is not None
        or args.from_offset is not None
        or args.to_datetime
        or args.by_duration
        or args.from_file
    )


def reset_spec(args: argparse.Namespace) -> ResetSpec:
    """The reset spec ``replay plan``'s options name (at most one; none: ``--until``'s earliest)."""
    if args.to_earliest or not _names_spec(args):
        return ToEarliest()
    if args.to_latest:
        return ToLatest()
    if args.to_current:
        return ToCurrent()
    if args.shift_by is not None:
        return ShiftBy(args.shift_by)
    if args.to_datetime:
        return ToDatetime(parse_datetime(args.to_datetime))
    if args.by_duration:
        return ByDuration(parse_duration(args.by_duration), datetime.now(UTC))
    if args.from_file:
        path = Path(args.from_file)
        try:
            text = path.read_text()
        except OSError as exc:
            msg = f"cannot read --from-file {path}: {exc.strerror}"
            raise PlanError(msg) from exc
        return FromFile(parse_offsets_csv(text), str(path))
    return FromOffset(args.from_offset)
