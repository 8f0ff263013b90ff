"""Checks a replay plan passes before anything runs.

* retention: every target is still in the log (a target below the log start is refused when the
  plan is built, unless ``--allow-data-loss``; the check reports the clamped partitions);
* state: a rebuild from anywhere but the log start starts from a snapshot taken at or before
  its targets (:mod:`refold.replay.snapshots`); without one it is refused;
* decode: the writer schemas of the records to reprocess are scanned (the header of each value:
  a single-object fingerprint, or a registry schema id mapped to its fingerprint through the
  schema registry), and each writer schema is checked against today's reader schema of its type with
  Avro schema resolution; unknown fingerprints and non-Avro records are reported (they would
  go to the dead-letter topic);
* estimate: the rebuild time from the last measured rebuild (informational): its records over
  the time its processor spent in micro-batches (the processor's stats), plus the start-up it
  measured (:class:`RebuildRate`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from refold.contracts.codec import EventCodec, writer_key
from refold.contracts.compat import reader_problem
from refold.contracts.errors import DeserializationError
from refold.contracts.kafka.consumers import passive_consumer
from refold.replay.errors import PlanError
from refold.replay.plan import PlanCheck, ReplayPlan

__all__ = [
    "FingerprintScan",
    "RebuildRate",
    "decode_check",
    "estimate_check",
    "rebuild_rate_of",
    "retention_check",
    "scan_fingerprints",
    "state_check",
]

NOT_AVRO = "not-avro"


@dataclass(frozen=True, slots=True)
class RebuildRate:
    """How fast a past rebuild went, as its generation's metadata recorded it.

    Attributes:
        generation: The generation the rebuild built.
        records: Records it applied (positions moved, dead letters included).
        seconds: Wall time from its processor's start to the flip.
        batch_seconds: Of that, the time its micro-batches took (the processor's stats,
            ``dur_sum_ms``); 0 when unknown (a rebuild recorded before it was kept, or stats
            that could not be read).
    """

    generation: int
    records: int
    seconds: float
    batch_seconds: float = 0.0

    @property
    def _batches_known(self) -> bool:
        return 0 < self.batch_seconds <= self.seconds

    @property
    def per_s(self) -> float:
        """Records/s while folding (over the batches' time), else over the whole wall time."""
        return self.records / (self.batch_seconds if self._batches_known else self.seconds)

    @property
    def startup_s(self) -> float:
        """The wall time outside micro-batches (JVM, session, first trigger); 0 when unknown.

        Unknown means the rate is over the whole wall time, start-up included already.
        """
        return self.seconds - self.batch_seconds if self._batches_known else 0.0

    def describe(self) -> str:
        """Where the rate comes from, for the plan's estimate line."""
        done = f"measured by the rebuild of g{self.generation}: {self.records:,} records in "
        if self._batches_known:
            return (
                f"{done}{self.batch_seconds:,.1f}s of micro-batches (the processor's stats) "
                f"after {self.startup_s:,.1f}s of start-up"
            )
        return f"{done}{self.seconds:,.1f}s, start-up included"


def rebuild_rate_of(generation: int, meta: Mapping[str, Any]) -> RebuildRate | None:
    """The rate a generation's rebuild recorded (pure), or None when it measured none.

    Reads ``rebuild_events``, ``rebuild_seconds`` and ``rebuild_batch_seconds`` (written by
    :func:`~refold.replay.rebuild.run_rebuild` at the flip). ``rebuild_rate``, which older
    rebuilds wrote, is ignored: it divided by the wall time less a 20 s start-up floored at 1 s,
    so a rebuild shorter than 21 s recorded its record count as its rate.
    """
    try:
        records = int(meta.get("rebuild_events") or 0)
        seconds = float(meta.get("rebuild_seconds") or 0)
        batch_seconds = float(meta.get("rebuild_batch_seconds") or 0)
    except (TypeError, ValueError):
        return None
    if records <= 0 or seconds <= 0:
        return None
    return RebuildRate(generation, records, seconds, max(0.0, batch_seconds))


@dataclass(frozen=True, slots=True)
class FingerprintScan:
    """Writer fingerprints (hex, or ``not-avro``) of the records in a plan's ranges."""

    counts: Mapping[str, int] = field(default_factory=dict)
    scanned: int = 0
    total: int = 0

    @property
    def complete(self) -> bool:
        """Every record of the ranges was looked at."""
        return self.scanned >= self.total


def scan_fingerprints(
    kafka: Mapping[str, Any], plan: ReplayPlan, limit: int, timeout: float = 60.0
) -> FingerprintScan:
    """Read the header of the records the plan will reprocess (up to ``limit`` in total).

    With a limit below the total, each partition contributes the same share from its start.

    Raises:
        PlanError: The broker did not deliver the records within ``timeout``.
    """
    rows = [r for r in plan.partitions if r.events > 0]
    total = sum(r.events for r in rows)
    if not rows or limit <= 0:
        return FingerprintScan({}, 0, total)
    share = max(1, limit // len(rows))
    ends = {(r.topic, r.partition): min(r.log_end, r.begin + share) for r in rows}
    consumer = passive_consumer(
        kafka,
        "refold-replay-scan",  # assign() only: never joined or committed
        tuning={"fetch.queue.backoff.ms": 10},  # the 1 s default throttles bulk reads ~8x
        eof=True,  # reaching the log end finishes a partition
    )
    counts: Counter[str] = Counter()
    scanned = 0
    todo = {tp for tp, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(r.topic, r.partition, r.begin) for r in rows])
    deadline = time.monotonic() + timeout
    try:
        while todo:
            if time.monotonic() > deadline:
                msg = f"scanning the records to reprocess took over {timeout:.0f}s; left: {todo}"
                raise PlanError(msg)
            for message in consumer.consume(10_000, timeout=0.2):
                tp = (message.topic() or "", message.partition() or 0)
                if tp not in todo:
                    continue
                error = message.error()
                offset = int(message.offset() or 0)
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public name
                        todo.discard(tp)
                        continue
                    msg = f"scanning {tp[0]}/{tp[1]} failed: {error.str()}"
                    raise PlanError(msg)
                if offset >= ends[tp]:
                    todo.discard(tp)
                    continue
                key = writer_key(message.value())
                counts[NOT_AVRO if key is None else key.hex()] += 1
                scanned += 1
                if offset + 1 >= ends[tp]:
                    todo.discard(tp)
    finally:
        consumer.close()
    return FingerprintScan(dict(counts), scanned, total)


def decode_check(
    scan: FingerprintScan, codec: EventCodec, *, accept_dead_letters: bool
) -> PlanCheck:
    """Every scanned writer schema must resolve to today's reader schema of its type."""
    if scan.total == 0:
        return PlanCheck("decode", True, "nothing to reprocess")
    if scan.scanned == 0:
        return PlanCheck("decode", True, f"not scanned ({scan.total} records; --scan-limit 0)")
    known: list[str] = []
    unresolvable: list[str] = []
    dead = 0
    for fingerprint, count in sorted(scan.counts.items()):
        if fingerprint == NOT_AVRO:
            dead += count
            continue
        try:
            writer = codec.writer_for_key(bytes.fromhex(fingerprint))
        except DeserializationError as exc:
            dead += count
            key = bytes.fromhex(fingerprint)
            named = (
                f"fingerprint {fingerprint}"
                if len(key) == 8  # single-object; a registry key is 5 bytes
                else f"schema id {int.from_bytes(key[1:], 'big')} ({exc.reason})"
            )
            unresolvable.append(f"unknown {named} ({count} records)")
            continue
        reader = codec.reader_for(writer.name)
        problem = None if reader is writer else reader_problem(reader, writer)
        if problem is not None:
            unresolvable.append(f"{problem} ({count} records)")
        else:
            known.append(f"{writer.name} v{writer.version}: {count}")
    not_avro = scan.counts.get(NOT_AVRO, 0)
    if not_avro:
        unresolvable.append(
            f"{not_avro} records are neither Avro single-object encoded nor registry framed"
        )
    coverage = (
        f"{scan.scanned} of {scan.total} records scanned"
        if not scan.complete
        else f"all {scan.total} records scanned"
    )
    detail = f"{coverage}; " + ", ".join(known or ["no decodable records"])
    if not unresolvable:
        return PlanCheck("decode", True, detail)
    incompatible = any("cannot read" in u for u in unresolvable)
    detail += "; " + "; ".join(unresolvable)
    if not incompatible and accept_dead_letters:
        return PlanCheck("decode", True, f"{detail} (accepted: {dead} go to the dead-letter topic)")
    action = (
        "fix the reader schema (contracts/schemas) so it resolves every writer version"
        if incompatible
        else "add the missing writer schemas to contracts/schemas, or pass "
        "--accept-dead-letters to rebuild anyway (those records go to the dead-letter "
        "topic, as they did when first processed)"
    )
    return PlanCheck("decode", False, detail, action)


def retention_check(plan: ReplayPlan) -> PlanCheck:
    """Targets inside ``[log start, log end]``; reports clamped partitions."""
    clamped = [f"{r.topic}/{r.partition}: {r.note}" for r in plan.partitions if "clamped" in r.note]
    begins_gone = [f"{r.topic}/{r.partition}" for r in plan.partitions if r.lost]
    if begins_gone:
        return PlanCheck(
            "retention",
            False,
            "the snapshot's positions are below the log start, and not in the archive, on "
            + ", ".join(begins_gone),
            "use a newer snapshot, or --to-earliest",
        )
    archived = sum(r.from_archive for r in plan.partitions)
    detail = (
        f"{archived} records below the log start come from the archive, the rest from the log"
        if archived
        else "every target is retained in the log"
    )
    if clamped:
        detail += " (clamped: " + "; ".join(clamped) + ")"
    return PlanCheck("retention", True, detail)


def state_check(plan: ReplayPlan, processor: str) -> PlanCheck:
    """A rebuild that skips records needs a snapshot of the state as of its targets."""
    if not plan.needs_state:
        return PlanCheck("state", True, "starts empty at the log start (a full rebuild)")
    if plan.seed is not None:
        return PlanCheck(
            "state",
            True,
            f"seeded from snapshot {plan.seed.name} (taken "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(plan.seed.created_at))})",
        )
    return PlanCheck(
        "state",
        False,
        "no snapshot at or before the targets: the new generation would start empty and miss "
        "the state of every record before them",
        f"take snapshots ahead of time (`replay snapshot --processor {processor}`, e.g. before "
        "each deploy), or rebuild everything with --to-earliest",
    )


def estimate_check(plan: ReplayPlan, rate: RebuildRate | None) -> PlanCheck:
    """Informational: the expected rebuild time, from a past rebuild's measured rate."""
    events = plan.total_events
    if rate is None:
        return PlanCheck(
            "estimate", True, f"{events} records; no measured rebuild yet to estimate the time"
        )
    seconds = rate.startup_s + events / rate.per_s
    return PlanCheck(
        "estimate",
        True,
        f"{events} records at {rate.per_s:,.0f} records/s ({rate.describe()}): about "
        f"{seconds:,.0f}s including start-up",
    )
