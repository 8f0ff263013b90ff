"""``replay plan``: print a rebuild's plan (dry run), run it and cut over, or reset in place."""

from __future__ import annotations

import argparse
import json
import os
import sys

import redis

from refold.contracts.processors import ProcessLauncher, ProcessorSpec, options_environ
from refold.contracts.progress import move_to, progress_bar
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.store.generations import GenerationRegistry
from refold.replay.arguments import reset_spec
from refold.replay.as_of import parse_until
from refold.replay.config import ReplaySettings
from refold.replay.in_place import reset_in_place
from refold.replay.plan import ReplayPlan
from refold.replay.rebuild import RebuildProgress, plan_replay, run_rebuild
from refold.replay.reset_specs import parse_scope

__all__ = ["cmd_plan"]


def cmd_plan(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay plan``: plan (and with ``--execute`` run) a rebuild of each processor named."""
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
        reset_spec(args),
        settings.kafka,
        client,
        settings.redis.key_prefix,
        parse_scope(args.topic),
        allow_data_loss=args.allow_data_loss,
        scan_limit=args.scan_limit,
        accept_dead_letters=args.accept_dead_letters,
        archive_root=settings.cold_tier(),
        until=parse_until(args.until, args.until_offsets),
    )
    if args.export:
        print(plan.export_csv(), end="")
        return 0
    _note_abandoned(spec, args, settings, client)
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        print(plan.render())
    if args.execute and args.in_place and plan.until:
        print("replay: --until builds a new generation; it cannot be --in-place", file=sys.stderr)
        return 2
    if args.execute and args.in_place:
        _reset_in_place(plan, spec, settings, client)
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
    _rebuild(plan, spec, args, settings)
    return 0


def _note_abandoned(
    spec: ProcessorSpec, args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis
) -> None:
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


def _reset_in_place(
    plan: ReplayPlan, spec: ProcessorSpec, settings: ReplaySettings, client: redis.Redis
) -> None:
    done = reset_in_place(plan, settings.kafka, client, settings.redis.key_prefix)
    seeded = f", restored from snapshot {done.seeded_from}" if done.seeded_from else ""
    print(
        f"\n{spec.name} g{done.generation} reset in place: {done.keys_removed} keys removed"
        f"{seeded}; consumer group {done.group} moved to the targets; checkpoint epoch "
        f"{done.checkpoint_epoch}. Start the processor (`refold process {spec.name}`) to "
        "fold again from there."
    )


def _rebuild(
    plan: ReplayPlan, spec: ProcessorSpec, args: argparse.Namespace, settings: ReplaySettings
) -> None:
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
                bar.write(
                    f"reached the bounds as of {plan.until}; keeping it (no flip)"
                    if plan.until
                    else "caught up with the log end taken at the start; cutting over"
                )

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
                schema_registry=settings.schema_registry,
            ),
        )
    if result.as_of:
        live = "none" if plan.live_generation is None else f"g{plan.live_generation}"
        print(
            f"\ng{result.generation} built as of {result.as_of} from {result.events} records in "
            f"{result.seconds:.1f}s and kept beside the live generation (status as_of; readers "
            f"still see {live}). Read it by naming it (StateReader/WindowReader "
            f"generation={result.generation}, HTTP ?generation={result.generation}); compare it "
            f"with live: `replay diff --processor {spec.name} {result.generation} "
            f"{plan.live_generation if plan.live_generation is not None else 'N'}`; remove it: "
            f"`replay gc --processor {spec.name} --generation {result.generation} --execute`."
        )
        return
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
