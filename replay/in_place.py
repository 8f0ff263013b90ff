"""The classic, stop-the-world reset: rewind the live generation itself (``--in-place``).

What ``kafka-consumer-groups --reset-offsets --execute`` does, for a stateful processor: the
generation's consumer group is moved to the plan's targets (refused by the broker while the
group has members, as Kafka does), its state is emptied (or restored from the plan's snapshot),
its applied positions are set to where folding starts again, and its Spark checkpoint epoch is
bumped so no processor resumes from a checkpoint of before the reset. Its processing stats
(``refold.contracts.store.stats``) start again too.

Refused while a processor holds the generation's lease (refold's own processors do not join
the consumer group, so the lease is how they show up as members). Readers keep reading the
generation throughout and see it emptied and refilled: prefer the online rebuild (without
``--in-place``) wherever readers matter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.layout import position_field
from refold.contracts.processors import consumer_group
from refold.contracts.settings import KafkaSettings
from refold.contracts.store.generations import (
    CHECKPOINT_EPOCH_FIELD,
    RESET_PENDING_FIELD,
    GenerationRegistry,
)
from refold.contracts.store.lease import GenerationLease, LeaseHeldError
from refold.contracts.store.scan import unlink_matching
from refold.contracts.store.stats import ProcessorStats
from refold.replay.errors import PlanError
from refold.replay.plan import ReplayPlan
from refold.replay.snapshots import Snapshot, SnapshotStore

__all__ = ["InPlaceResult", "reset_in_place"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InPlaceResult:
    """What an in-place reset did."""

    generation: int
    group: str
    keys_removed: int
    checkpoint_epoch: int
    seeded_from: str | None


def _move_group(kafka: KafkaSettings, group: str, plan: ReplayPlan) -> None:
    """Commit the targets to the group; the broker refuses while the group has members."""
    admin = AdminClient(dict(kafka.as_librdkafka().items()))
    partitions = [TopicPartition(r.topic, r.partition, r.begin) for r in plan.partitions]
    futures = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, partitions)])
    try:
        for future in futures.values():
            result = future.result()
            for tp in result.topic_partitions or []:
                if tp.error is not None:
                    raise KafkaException(tp.error)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        msg = (
            f"the broker refused to move consumer group {group}: {error}. The group has "
            "live members (as with Kafka's reset tool, stop every consumer of the group "
            "first); nothing was changed."
        )
        raise PlanError(msg) from exc


def _reset_state(
    registry: GenerationRegistry, generation: int, plan: ReplayPlan, snapshot: Snapshot | None
) -> int:
    """Empty the generation's state (or restore ``snapshot``); set where folding resumes.

    Sharded, shard by shard, and the positions in each partition's shard.
    """
    client = registry.client
    keys = registry.keys(generation)
    # Every shard's state too (a sharded generation's, each in its own slot). Its guards go
    # with it, as unsharded: a writer WATCHing one sees it change, and the next sets it again.
    removed = sum(
        unlink_matching(client, pattern, only=keys.is_state_key) for pattern in keys.patterns()
    )
    # Not state, but counted by checkpoint and batch id: the new checkpoint epoch starts both
    # again, and the stats describe the generation's folding from its new start.
    ProcessorStats(client, registry.layout).reset(generation)
    if snapshot is not None:
        SnapshotStore(registry).seed(snapshot, generation)
    # Folding restarts at each partition's begin: record it where the processor resumes from.
    registry.set_positions(
        generation, {position_field(r.topic, r.partition): r.begin for r in plan.partitions}
    )
    return removed


def reset_in_place(
    plan: ReplayPlan, kafka: KafkaSettings, client: redis.Redis, key_prefix: str
) -> InPlaceResult:
    """Rewind the live generation to ``plan`` (see the module docstring).

    Raises:
        PlanError: No live generation, a failed plan check, a processor holds the lease, or
            the broker refused to move the group; nothing was changed in any of these cases.
    """
    failed = [c for c in plan.checks if not c.ok]
    if failed:
        msg = "the plan failed its checks, nothing was changed: " + "; ".join(
            f"{c.name}: {c.detail}. What to do: {c.action}" for c in failed
        )
        raise PlanError(msg)
    generation = plan.live_generation
    if generation is None:
        msg = f"{plan.processor} has no live generation to reset in place"
        raise PlanError(msg)
    registry = GenerationRegistry.of(client, plan.processor, key_prefix)
    # The reset holds the generation's lease itself: no processor can start in the middle.
    lease = GenerationLease(registry, generation)
    try:
        lease.acquire(0)
    except LeaseHeldError as exc:
        msg = (
            f"{plan.processor} g{generation} is being processed by "
            f"{registry.lease_owner(generation)}: an in-place reset needs its processor stopped "
            "(it is a member of the generation). Stop it, or rebuild online without "
            "--in-place; nothing was changed."
        )
        raise PlanError(msg) from exc
    try:
        store = SnapshotStore(registry)
        snapshot = (
            store.get(plan.seed.generation, plan.seed.snapshot) if plan.seed is not None else None
        )
        if snapshot is not None:  # refused here, before the group and the state are changed
            store.check_seedable(snapshot, generation)
        group = consumer_group(plan.processor, generation, key_prefix)
        _move_group(kafka, group, plan)
        # From here the generation is half reset until the marker goes: a processor that
        # starts after a crash of this reset (its lease expired) refuses it, and the new
        # epoch means no processor resumes the checkpoint of before the reset.
        meta = registry.keys(generation).meta
        client.hset(meta, RESET_PENDING_FIELD, plan.spec)
        epoch = int(client.hincrby(meta, CHECKPOINT_EPOCH_FIELD, 1))
        removed = _reset_state(registry, generation, plan, snapshot)
        registry.update_meta(generation, {"reset_in_place": plan.spec})
        client.hdel(meta, RESET_PENDING_FIELD)
    finally:
        lease.release()
    seeded_from = snapshot.name if snapshot is not None else None
    logger.info("g%d reset in place (%s), checkpoint epoch %d", generation, plan.spec, epoch)
    return InPlaceResult(generation, group, removed, epoch, seeded_from)
