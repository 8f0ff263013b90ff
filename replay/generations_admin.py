"""Operate on a processor's generations: status, rollback, garbage collection, diff.

Reads and writes Redis through the shared layout (:mod:`refold.contracts.layout`); never imports
processor code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.layout import GenerationKeys, StateLayout
from refold.contracts.processors import ProcessorSpec
from refold.contracts.settings import SparkSettings
from refold.contracts.store.generations import (
    GenerationInfo,
    GenerationRegistry,
    Positions,
    applied_records,
    processors_in_redis,
    starting_positions,
)
from refold.contracts.store.scan import scan_batches, unlink_matching
from refold.contracts.store.sketches import union_counts
from refold.contracts.windows import combine
from refold.processors.runtime.checkpoints import remove_generation_checkpoints
from refold.processors.runtime.kinds import kind_diffs
from refold.replay.errors import ReplayError

__all__ = [
    "GenerationDiff",
    "GenerationStatus",
    "collect_garbage",
    "diff_generations",
    "generation_status",
    "processors_in_redis",
    "rollback",
    "unregistered_spec",
]

_EXAMPLES = 5
# The window namespaces of RESULT_NAMESPACES (refold.contracts.layout): bucket hashes, distinct
# sketches.
_BUCKETS, _SKETCHES = "w:", "wd:"


@dataclass(frozen=True, slots=True)
class GenerationStatus:
    """One row of ``replay status``."""

    processor: str
    generation: int
    status: str
    age_s: float
    applied: int
    lag: int | None
    code_fingerprint: str
    meta: dict[str, str]
    registered: bool = True
    runner: str = "-"

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "processor": self.processor,
            "registered": self.registered,
            "generation": self.generation,
            "status": self.status,
            "age_s": round(self.age_s, 1),
            "applied": self.applied,
            "lag": self.lag,
            "code_fingerprint": self.code_fingerprint,
            "runner": self.runner,
            "meta": self.meta,
        }


def _age(info: GenerationInfo) -> float:
    created = info.meta.get("created_at")
    return max(0.0, time.time() - int(created) / 1000) if created else 0.0


def unregistered_spec(name: str) -> ProcessorSpec:
    """A stand-in spec for a processor found in Redis that no installed package registers."""
    return ProcessorSpec(
        name=name, projection="(unregistered):-", topics=("(unknown)",), key="", tables=()
    )


def generation_status(
    spec: ProcessorSpec,
    client: redis.Redis,
    key_prefix: str,
    offsets: LogOffsets | None,
    *,
    known: bool = True,
) -> list[GenerationStatus]:
    """Every generation of a processor with its applied records and lag to the log end.

    Args:
        spec: The processor.
        client: Redis.
        key_prefix: Key prefix.
        offsets: Used to compute lag; None skips it.
        known: False for a processor no installed package registers (shown as such).
    """
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    rows = []
    ends: Positions | None = None
    for info in registry.list():
        positions, _batch = registry.positions(info.generation)
        lag = None
        if offsets is not None:
            if ends is None:
                topics = json.loads(info.meta.get("topics", "[]")) or [
                    t for t in spec.topics if t != "(unknown)"
                ]
                tps = [(t, p) for t in topics for p in offsets.partitions(t)]
                ends = offsets.end_offsets(tps)
            lag = sum(max(0, end - positions.get(tp, 0)) for tp, end in ends.items())
        applied = applied_records(positions, starting_positions(info.meta))
        rows.append(
            GenerationStatus(
                spec.name,
                info.generation,
                info.status,
                _age(info),
                applied,
                lag,
                info.meta.get("code_fingerprint", ""),
                info.meta,
                known,
                registry.runner(info.generation, info.status, info.meta),
            )
        )
    return rows


def rollback(spec: ProcessorSpec, client: redis.Redis, key_prefix: str) -> tuple[int, int]:
    """Flip readers back to the generation the live one replaced.

    Returns:
        (generation now live, generation that was live).

    Raises:
        ReplayError: Nothing to roll back to (no live generation, or the previous one is gone).
    """
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    live = registry.live()
    if live is None:
        msg = f"{spec.name} has no live generation"
        raise ReplayError(msg)
    meta = next((g.meta for g in registry.list() if g.generation == live), {})
    previous = meta.get("replaced")
    if not previous:
        msg = f"{spec.name} g{live} did not replace another generation; nothing to roll back to"
        raise ReplayError(msg)
    target = int(previous)
    if registry.status(target) is None:
        msg = f"{spec.name} g{target} was removed by `replay gc`; cannot roll back to it"
        raise ReplayError(msg)
    registry.flip(target, record_replaced=False)
    return target, live


def collect_garbage(
    spec: ProcessorSpec,
    client: redis.Redis,
    key_prefix: str,
    checkpoint_root: str,
    *,
    execute: bool,
    spark: SparkSettings | None = None,
    include_as_of: bool = False,
    only: Collection[int] | None = None,
) -> list[tuple[int, int]]:
    """Remove retired and abandoned generations: their Redis keys, entry and Spark checkpoint.

    Abandoned: ``building``, and neither a processor nor a ``replay`` holds it (its replay
    was killed; :func:`refold.contracts.store.generations.is_abandoned`). A generation kept as
    of a moment (``as_of``, ``replay --until``) only with ``include_as_of``, or when ``only``
    names it.

    Args:
        spec: The processor.
        client: Redis.
        key_prefix: Key prefix.
        checkpoint_root: Where its Spark checkpoints are.
        execute: Remove them (False: a dry run, listing them).
        spark: Spark settings (a checkpoint URL's file system).
        include_as_of: Remove the generations kept as of a moment too.
        only: Remove just these generations (each retired, abandoned or as of a moment).

    Returns:
        ``(generation, keys removed)`` per generation removed (keys 0 in a dry run).

    Raises:
        ReplayError: ``only`` names a generation that does not exist, or one that is live or
            being built.
    """
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    abandoned = set(registry.abandoned())
    removable = {"retired", "as_of"} if include_as_of or only else {"retired"}
    infos = registry.list()
    if only:
        known = {info.generation: info.status for info in infos}
        refused = [
            f"g{g} ({known.get(g, 'no such generation')})"
            for g in sorted(set(only))
            if known.get(g) not in removable and g not in abandoned
        ]
        if refused:
            msg = (
                f"{spec.name}: gc removes retired, abandoned and as-of generations only, "
                f"not {', '.join(refused)}; see `replay status`"
            )
            raise ReplayError(msg)
    done = []
    for info in infos:
        if only and info.generation not in only:
            continue
        if info.status not in removable and info.generation not in abandoned:
            continue
        removed = 0
        if execute:
            # The generation's own keys, then each shard's (a sharded generation's: own slots).
            keys = registry.keys(info.generation)
            removed = sum(unlink_matching(client, pattern) for pattern in keys.patterns())
            registry.forget(info.generation)
            remove_generation_checkpoints(checkpoint_root, spec.name, info.generation, spark)
        done.append((info.generation, removed))
    return done


@dataclass(slots=True)
class GenerationDiff:
    """Key-by-key comparison of two generations."""

    a: int
    b: int
    compared: int = 0
    same: int = 0
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)
    aggregates_differing: dict[str, tuple[dict[str, int], dict[str, int]]] = field(
        default_factory=dict
    )
    buckets_compared: int = 0
    buckets_differing: dict[str, tuple[dict[str, int], dict[str, int]]] = field(
        default_factory=dict
    )
    sketches_compared: int = 0
    sketches_differing: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Kinds added as modules, by kind: their differing keys (their own diff decides).
    kinds_differing: dict[str, dict[str, tuple[Any, Any]]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """True when every key, aggregate, window bucket and distinct sketch matches."""
        return not (
            self.only_in_a
            or self.only_in_b
            or self.differing
            or self.aggregates_differing
            or self.buckets_differing
            or self.sketches_differing
            or any(self.kinds_differing.values())
        )

    def render(self) -> str:
        """For people, with a few examples of each kind."""
        lines = [
            f"g{self.a} vs g{self.b}: {self.compared} keys compared, {self.same} identical, "
            f"{len(self.differing)} differing, {len(self.only_in_a)} only in g{self.a}, "
            f"{len(self.only_in_b)} only in g{self.b}"
        ]
        for label, keys in (
            ("differing", self.differing),
            (f"only in g{self.a}", self.only_in_a),
            (f"only in g{self.b}", self.only_in_b),
        ):
            if keys:
                shown = ", ".join(sorted(keys)[:_EXAMPLES])
                more = f" (+{len(keys) - _EXAMPLES} more)" if len(keys) > _EXAMPLES else ""
                lines.append(f"  {label}: {shown}{more}")
        for name, (in_a, in_b) in self.aggregates_differing.items():
            lines.append(f"  aggregate {name}: g{self.a}={in_a} g{self.b}={in_b}")
        if self.buckets_compared or self.sketches_compared:
            lines.append(
                f"  windows: {self.buckets_compared} buckets compared, "
                f"{len(self.buckets_differing)} differing; {self.sketches_compared} distinct "
                f"sketches compared, {len(self.sketches_differing)} differing (estimates)"
            )
        lines += self._examples("bucket", self.buckets_differing)
        lines += self._examples("sketch", self.sketches_differing)
        for kind, differing in sorted(self.kinds_differing.items()):
            lines += self._examples(kind, differing)
        lines.append("identical" if self.identical else "NOT identical")
        return "\n".join(lines)

    def _examples(self, label: str, differing: dict[str, tuple[Any, Any]]) -> list[str]:
        """A few differing window keys, as aggregates are shown (missing: empty or 0)."""
        lines = [
            f"  {label} {key}: g{self.a}={differing[key][0]} g{self.b}={differing[key][1]}"
            for key in sorted(differing)[:_EXAMPLES]
        ]
        if len(differing) > _EXAMPLES:
            lines.append(f"  (+{len(differing) - _EXAMPLES} more {label}s differing)")
        return lines


def _entities(client: redis.Redis, keys: GenerationKeys, table: str) -> Iterator[tuple[str, bytes]]:
    """Every entity of ``table`` (every shard's), by its key, with its raw value."""
    for shard in keys.each_shard():
        head = len(shard.table(table, ""))
        for batch in scan_batches(client, shard.table_pattern(table)):  # one slot: one MGET
            yield from _load(client, batch, head)


def _load(client: redis.Redis, names: list[str], prefix_len: int) -> Iterator[tuple[str, bytes]]:
    values = cast("list[bytes | None]", client.mget(names))
    for name, value in zip(names, values, strict=True):
        if value is not None:
            yield name[prefix_len:], value


def diff_generations(
    spec: ProcessorSpec, client: redis.Redis, key_prefix: str, a: int, b: int
) -> GenerationDiff:
    """Compare every table, aggregate, window bucket and distinct sketch of two generations.

    Window buckets (``w:``) compare as dicts of integers; distinct sketches (``wd:``) by their
    HyperLogLog estimates (PFCOUNT), since two sketches of the same values may differ in bytes
    (sparse or dense encoding, cached cardinality). A bucket or sketch missing on one side is
    compared as empty (0).

    Raises:
        ReplayError: A generation does not exist.
    """
    registry = GenerationRegistry(client, StateLayout(spec.name, key_prefix))
    for gen in (a, b):
        if registry.status(gen) is None:
            msg = f"{spec.name} has no generation {gen}; see `replay status`"
            raise ReplayError(msg)
    result = GenerationDiff(a, b)
    keys_a, keys_b = registry.keys(a), registry.keys(b)  # sharded or not, each as created
    for table in spec.tables:
        in_a = dict(_entities(client, keys_a, table))
        for key, value in _entities(client, keys_b, table):
            result.compared += 1
            other = in_a.pop(key, None)
            label = f"{table}:{key}"
            if other is None:
                result.only_in_b.append(label)
            elif json.loads(other) == json.loads(value):
                result.same += 1
            else:
                result.differing.append(label)
        result.only_in_a.extend(f"{table}:{key}" for key in in_a)
        result.compared += len(in_a)
    for name in spec.aggregates:
        agg_a, agg_b = _counters(client, keys_a, name), _counters(client, keys_b, name)
        if agg_a != agg_b:
            result.aggregates_differing[name] = (agg_a, agg_b)
    _diff_windows(client, keys_a, keys_b, result)
    for kind, diff in kind_diffs():  # the kinds added as modules compare their own keys
        differing = dict(diff(client, keys_a, keys_b))
        if differing:
            result.kinds_differing[kind] = differing
    return result


def _diff_windows(
    client: redis.Redis, keys_a: GenerationKeys, keys_b: GenerationKeys, result: GenerationDiff
) -> None:
    """Compare the window buckets and distinct sketches of two generations (whatever windows)."""
    buckets_a = _window_keys(client, keys_a, _BUCKETS, _bucket_values)
    buckets_b = _window_keys(client, keys_b, _BUCKETS, _bucket_values)
    result.buckets_compared = len(buckets_a.keys() | buckets_b.keys())
    for key in buckets_a.keys() | buckets_b.keys():
        in_a, in_b = buckets_a.get(key, {}), buckets_b.get(key, {})
        if in_a != in_b:
            result.buckets_differing[key] = (in_a, in_b)
    sketches_a = _window_keys(client, keys_a, _SKETCHES, _sketch_counts)
    sketches_b = _window_keys(client, keys_b, _SKETCHES, _sketch_counts)
    result.sketches_compared = len(sketches_a.keys() | sketches_b.keys())
    for key in sketches_a.keys() | sketches_b.keys():
        count_a, count_b = sketches_a.get(key, 0), sketches_b.get(key, 0)
        if count_a != count_b:
            result.sketches_differing[key] = (count_a, count_b)


def _window_keys(
    client: redis.Redis,
    keys: GenerationKeys,
    namespace: str,
    load: Callable[[redis.Redis, GenerationKeys, dict[str, list[str]]], dict[str, Any]],
) -> dict[str, Any]:
    """Every key of one namespace of a generation, named without its base (its shard's).

    A sharded window processor keeps each partition id's share of a bucket or sketch in its
    shard: ``load`` gets every shard's keys of each name and merges them.
    """
    names: dict[str, list[str]] = {}
    for shard in keys.each_shard():
        head = len(shard.base) + 1
        for batch in scan_batches(client, shard.namespace_pattern(namespace)):
            for name in batch:
                names.setdefault(name[head:], []).append(name)
    return load(client, keys, names)


def _bucket_values(
    client: redis.Redis, _keys: GenerationKeys, names: dict[str, list[str]]
) -> dict[str, dict[str, int]]:
    """Each bucket: its shards' shares combined (counts and sums add, extremes combine)."""
    with client.pipeline(transaction=False) as pipe:
        for shares in names.values():
            for name in shares:
                pipe.hgetall(name)
        raws = iter(cast("list[dict[bytes, bytes]]", pipe.execute()))
    out = {}
    for bucket, shares in names.items():
        parts = [next(raws) for _ in shares]
        out[bucket] = combine({k.decode(): int(v) for k, v in raw.items()} for raw in parts)
    return out


def _sketch_counts(
    client: redis.Redis, keys: GenerationKeys, names: dict[str, list[str]]
) -> dict[str, int]:
    """Each sketch's estimate: of the union of its shards' sketches (sharded)."""
    counts = union_counts(client, list(names.values()), keys.scratch("pf"))
    return dict(zip(names, counts, strict=True))


def _counters(client: redis.Redis, keys: GenerationKeys, name: str) -> dict[str, int]:
    """An aggregate's counters: a sharded generation's are each shard's share, added up."""
    with client.pipeline(transaction=False) as pipe:
        for shard in keys.each_shard():
            pipe.hgetall(shard.aggregate(name))
        raws = cast("list[dict[bytes, bytes]]", pipe.execute())
    total: dict[str, int] = {}
    for raw in raws:
        for field_name, value in raw.items():
            total[field_name.decode()] = total.get(field_name.decode(), 0) + int(value)
    return {k: v for k, v in total.items() if v != 0}
