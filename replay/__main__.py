"""``replay``: rebuild a processor's state from the log into a new generation, online.

Dry run by default: prints the per-partition plan. ``--execute`` builds the new generation while
the live one keeps serving readers, waits until it has caught up, then flips readers to it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import redis

from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import RefoldError
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.logconfig import configure_logging
from refold.contracts.processors import ProcessLauncher, ProcessorSpec, options_environ
from refold.contracts.progress import move_to, progress_bar
from refold.contracts.registry import default_registry, processor_spec, with_fallback
from refold.contracts.store.connect import redis_client
from refold.contracts.store.credentials import redis_refused
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.replay.config import ReplaySettings
from refold.replay.deploy_gate import check_deploy, deployed_fingerprints
from refold.replay.errors import PlanError, ReplayInterruptedError
from refold.replay.generations_admin import (
    collect_garbage,
    diff_generations,
    generation_status,
    processors_in_redis,
    rollback,
    unregistered_spec,
)
from refold.replay.in_place import reset_in_place
from refold.replay.plan import (
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
    parse_scope,
)
from refold.replay.rebuild import RebuildProgress, plan_replay, run_rebuild
from refold.replay.snapshots import SnapshotStore

__all__ = ["build_parser", "main", "parse_args"]


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
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="plan a rebuild (dry run) or run it with --execute")
    which = plan.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--processor",
        action="append",
        metavar="NAME",
        help="the processor (repeatable)",
    )
    which.add_argument("--all", action="store_true", help="every processor")
    spec = plan.add_mutually_exclusive_group(required=True)
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

    status = sub.add_parser("status", help="generations of every processor (or one)")
    _add_processor(status, required=False)
    status.add_argument("--json", action="store_true", help="print JSON")

    back = sub.add_parser(
        "rollback", help="flip readers back to the generation the live one replaced"
    )
    _add_processor(back)

    gc = sub.add_parser("gc", help="remove retired generations (dry run without --execute)")
    _add_processor(gc)
    gc.add_argument("--execute", action="store_true", help="really remove them")

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
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, accepting ``replay --processor ...`` for ``replay plan --processor ...``."""
    parser = build_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS:
        close = difflib.get_close_matches(argv[0], sorted(_COMMANDS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unknown command {argv[0]!r}{hint}; commands: {', '.join(_COMMANDS)}")
    if argv and argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["plan", *argv]
    return parser.parse_args(argv)


def _cmd_plan(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    names = (
        sorted(default_registry().processors) if args.all else list(dict.fromkeys(args.processor))
    )
    if args.json and len(names) > 1:
        print("replay: --json takes one processor", file=sys.stderr)
        return 2
    for name in names:
        code = _plan_one(processor_spec(name), args, settings, client)
        if code:
            return code
    return 0


def _plan_one(
    spec: ProcessorSpec, args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis
) -> int:
    plan = plan_replay(
        spec,
        _reset_spec(args),
        settings.kafka,
        client,
        settings.redis.key_prefix,
        parse_scope(args.topic),
        allow_data_loss=args.allow_data_loss,
        scan_limit=args.scan_limit,
        accept_dead_letters=args.accept_dead_letters,
    )
    if args.export:
        print(plan.export_csv(), end="")
        return 0
    abandoned = GenerationRegistry.of(client, spec.name, settings.redis.key_prefix)
    left = abandoned.abandoned()
    if left:
        print(
            f"note: {spec.name} {', '.join(f'g{g}' for g in left)} "
            f"{'was' if len(left) == 1 else 'were'} left building by a replay that is gone "
            f"(abandoned); `replay gc --processor {spec.name} --execute` removes "
            f"{'it' if len(left) == 1 else 'them'}",
            file=sys.stderr if args.json else sys.stdout,
        )
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        print(plan.render())
    if args.execute and args.in_place:
        done = reset_in_place(plan, settings.kafka, client, settings.redis.key_prefix)
        seeded = f", restored from snapshot {done.seeded_from}" if done.seeded_from else ""
        print(
            f"\n{spec.name} g{done.generation} reset in place: {done.keys_removed} keys removed"
            f"{seeded}; consumer group {done.group} moved to the targets; checkpoint epoch "
            f"{done.checkpoint_epoch}. Start the processor (`refold process {spec.name}`) to "
            "fold again from there."
        )
        return 0
    if not args.execute:
        if not args.json:
            verdict = (
                "Add --execute to rebuild and cut over."
                if plan.ready
                else "The plan fails its checks: --execute would refuse it."
            )
            print(f"\ndry run: nothing changed. {verdict}")
        return 0
    with progress_bar(
        total=plan.total_events,
        unit="ev",
        desc=f"rebuilding {spec.name}",
        shown=not args.no_progress,
    ) as bar:
        announced = False

        def _progress(progress: RebuildProgress) -> None:
            nonlocal announced
            bar.total = progress.total
            worst = max(progress.lag.items(), key=lambda kv: kv[1], default=None)
            most = f" (most: {worst[0][0]}/{worst[0][1]} {worst[1]})" if worst and worst[1] else ""
            move_to(bar, progress.done, f"lag {sum(progress.lag.values())}{most}")
            if progress.caught_up and not announced:
                announced = True
                bar.write("caught up with the log end taken at the start; cutting over")

        result = run_rebuild(
            plan,
            spec,
            settings.kafka,
            settings.redis,
            state_dir=settings.state_dir,
            lag_threshold=settings.lag_threshold,
            timeout_s=settings.replay_timeout_s,
            on_progress=_progress,
            launcher=ProcessLauncher(
                settings.kafka,
                settings.redis,
                settings.spark,
                settings.state_dir,
                options_environ([spec.name], os.environ),
            ),
        )
    previous = "none" if result.previous is None else f"g{result.previous}"
    print(
        f"\ng{result.generation} built from {result.events} records in {result.seconds:.1f}s; "
        f"readers now see g{result.generation} (previous: {previous}, kept as retired; "
        "`replay rollback` flips back).\n"
        f"A processor running with --generation live (`refold process {spec.name}`) continues "
        f"g{result.generation} by itself if it runs the code g{result.generation} was built by "
        "(one running other code stops, and `replay status` says so); start one if none is "
        "running."
    )
    return 0


def _reset_spec(args: argparse.Namespace) -> ResetSpec:
    if args.to_earliest:
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


def _cmd_status(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    registered = default_registry().processors
    found = processors_in_redis(client, settings.redis.key_prefix)
    if args.processor:
        names = [args.processor]
        if args.processor not in registered and args.processor not in found:
            processor_spec(args.processor)  # raises, naming the registered ones
    else:
        names = sorted(set(registered) | set(found))
    offsets = LogOffsets(settings.kafka.as_librdkafka())
    try:
        rows = [
            row
            for name in names
            for row in generation_status(
                registered.get(name) or unregistered_spec(name),
                client,
                settings.redis.key_prefix,
                offsets,
                known=name in registered,
            )
        ]
    finally:
        offsets.close()
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    if not rows:
        print("no generations yet: start a processor (`refold process NAME`)")
        return 0
    if any(not r.registered for r in rows):
        print("NAME? = in Redis, but no installed package registers it (see `refold processors`)")
    print(
        f"{'PROCESSOR':<14} {'GEN':>4} {'STATUS':<9} {'AGE':>8} {'APPLIED':>10} {'LAG':>8}  "
        f"{'CODE':<16}  RUNNER"
    )
    for r in rows:
        lag = "-" if r.lag is None else str(r.lag)
        name = r.processor if r.registered else f"{r.processor}?"
        print(
            f"{name:<14} {r.generation:>4} {r.status:<9} {r.age_s:>7.0f}s "
            f"{r.applied:>10} {lag:>8}  {r.code_fingerprint:<16}  {r.runner}"
        )
    return 0


def _cmd_rollback(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    now, before = rollback(processor_spec(args.processor), client, settings.redis.key_prefix)
    print(f"{args.processor}: readers now see g{now} (g{before} is retired, not deleted)")
    return 0


def _cmd_gc(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    removed = collect_garbage(
        processor_spec(args.processor),
        client,
        settings.redis.key_prefix,
        checkpoint_root(settings.state_dir, settings.spark, key_prefix=settings.redis.key_prefix),
        execute=args.execute,
        spark=settings.spark,
    )
    if not removed:
        print(f"{args.processor}: no retired or abandoned generations")
        return 0
    for generation, keys in removed:
        verb = f"removed ({keys} keys and its checkpoint)" if args.execute else "would be removed"
        print(f"{args.processor} g{generation}: {verb}")
    if not args.execute:
        print("dry run: add --execute to remove them")
    return 0


def _cmd_snapshot(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    registry = GenerationRegistry.of(client, args.processor, settings.redis.key_prefix)
    store = SnapshotStore(registry)
    if args.list:
        snapshots = store.list(args.generation)
        if args.json:
            print(json.dumps([s.as_dict() for s in snapshots], indent=2))
            return 0
        if not snapshots:
            print(
                f"{args.processor}: no snapshots (`replay snapshot --processor {args.processor}`)"
            )
            return 0
        print(f"{'SNAPSHOT':<10} {'TAKEN':<19} {'KEYS':>8} {'APPLIED':>10}  CODE")
        for s in snapshots:
            taken = datetime.fromtimestamp(s.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
            print(
                f"{s.name:<10} {taken:<19} {s.keys:>8} {sum(s.positions.values()):>10}  "
                f"{s.code_fingerprint}"
            )
        return 0
    generation = args.generation if args.generation is not None else registry.live()
    if generation is None:
        print(f"replay: {args.processor} has no live generation yet", file=sys.stderr)
        return 1
    snapshot = store.take(generation)
    if args.json:
        print(json.dumps(snapshot.as_dict(), indent=2))
    else:
        print(
            f"{args.processor}: snapshot {snapshot.name} taken ({snapshot.keys} keys, "
            f"{sum(snapshot.positions.values())} records applied). Rebuilds whose targets are "
            "at or after its positions start from it."
        )
    return 0


def _cmd_diff(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    result = diff_generations(
        processor_spec(args.processor), client, settings.redis.key_prefix, args.a, args.b
    )
    print(result.render())
    return 0 if result.identical else 4


def _cmd_check(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    spec = processor_spec(args.processor)
    verdict = check_deploy(spec, client, settings.redis.key_prefix, deployed_fingerprints(spec))
    if args.json:
        print(
            json.dumps(
                {
                    "processor": verdict.processor,
                    "live": verdict.live_generation,
                    "compatible": verdict.compatible,
                    "changed": list(verdict.changed),
                }
            )
        )
    else:
        print(verdict.render())
    return 0 if verdict.compatible else 5


_HANDLERS = {
    "plan": _cmd_plan,
    "status": _cmd_status,
    "rollback": _cmd_rollback,
    "gc": _cmd_gc,
    "diff": _cmd_diff,
    "check": _cmd_check,
    "snapshot": _cmd_snapshot,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code.

    0 ok, 1 error, 4 ``diff`` found differences, 5 ``check``: a rebuild is needed, 143 / 130
    a rebuild interrupted by SIGTERM / SIGINT (its processor stopped, readers left where they
    were).
    """
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging(args.log_level, json_lines=False)
    settings = ReplaySettings()
    try:
        client = redis_client(settings.redis.client_url())
        return _HANDLERS[args.command](args, settings, client)
    except ReplayInterruptedError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return exc.exit_code
    except redis.AuthenticationError as exc:
        print(f"replay: {redis_refused('replay', client, exc)}", file=sys.stderr)
        return 1
    except (RefoldError, redis.RedisError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
