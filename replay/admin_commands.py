"""The ``replay`` commands on generations (all but ``plan``), each returning its exit code.

``status``, ``rollback``, ``gc``, ``snapshot``, ``diff`` and ``check`` (the deploy gate) print
their answer; the work is done by :mod:`refold.replay.generations_admin`,
:mod:`refold.replay.snapshots` and :mod:`refold.replay.deploy_gate`.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

import redis

from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.registry import default_registry, processor_spec
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.replay.config import ReplaySettings
from refold.replay.deploy_gate import check_deploy, deployed_fingerprints
from refold.replay.generations_admin import (
    collect_garbage,
    diff_generations,
    generation_status,
    processors_in_redis,
    rollback,
    unregistered_spec,
)
from refold.replay.snapshots import SnapshotStore

__all__ = ["cmd_check", "cmd_diff", "cmd_gc", "cmd_rollback", "cmd_snapshot", "cmd_status"]


def cmd_status(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay status``: every generation of every processor (or of one)."""
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


def cmd_rollback(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay rollback``: flip readers back to the generation the live one replaced."""
    now, before = rollback(processor_spec(args.processor), client, settings.redis.key_prefix)
    print(f"{args.processor}: readers now see g{now} (g{before} is retired, not deleted)")
    return 0


def cmd_gc(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay gc``: remove retired and abandoned generations (dry run without ``--execute``).

    Generations kept as of a moment stay unless ``--include-as-of`` or ``--generation N``.
    """
    removed = collect_garbage(
        processor_spec(args.processor),
        client,
        settings.redis.key_prefix,
        checkpoint_root(settings.state_dir, settings.spark, key_prefix=settings.redis.key_prefix),
        execute=args.execute,
        spark=settings.spark,
        include_as_of=args.include_as_of,
        only=args.generation,
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


def cmd_snapshot(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay snapshot``: take a snapshot of a generation, or list the snapshots."""
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


def cmd_diff(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay diff``: compare two generations key by key (exit 4 when they differ)."""
    result = diff_generations(
        processor_spec(args.processor), client, settings.redis.key_prefix, args.a, args.b
    )
    print(result.render())
    return 0 if result.identical else 4


def cmd_check(args: argparse.Namespace, settings: ReplaySettings, client: redis.Redis) -> int:
    """``replay check``: the deploy gate (exit 5 when a rebuild is needed)."""
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
