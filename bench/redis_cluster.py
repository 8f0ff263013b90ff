"""``python -m bench cluster``: the entity fold on a local Redis Cluster against one redis-server.

One run, one backlog. The same order records go through the fold envelope (``FoldWriter``, in
25,000-record transactions as a Spark task applies them) into a single redis-server, into a
local cluster of 3 masters with 1 replica each (``refold up --redis-cluster``) as one slot
(an unsharded generation), and into the cluster sharded by partition id (8 shards, one
transaction per partition id), in turn, for ``--rounds``. Printed: events/s of each, the
cluster's share of the single server's rate, the commands each master served during each
cluster variant (bytes in, INFO stats), and failover: the master of a shard killed while a writer
applies batches, the seconds until a batch commits again. One machine: the cluster cannot be
faster here; the figures say what it costs and how evenly the masters share the work.

``--windows``: the same with sales_windows (a window processor, sharded by partition id in
the third variant), and the read cost of each variant: a window read, an hour's distinct
count and the closer emitting every window the watermark passed (:mod:`bench.cluster_windows`).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from redis.cluster import RedisCluster

from bench.backlog import ORDERS_TOPIC, produce_orders
from bench.cluster_windows import read_costs, results_spec, windows_target, windows_writer
from bench.envelope_only import apply_in_chunks, read_records
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import TopicSpec, effects_spec
from refold.deploy.local_stack import LocalStack, free_port
from refold.deploy.redis_cluster import LocalRedisCluster, free_port_run
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import (
    DEFAULT_NOTIFICATIONS_TOPIC,
    OrderStateProjection,
)
from refold.processors.runtime.envelope import FoldTarget, FoldWriter

__all__ = ["main"]


def _calls(cluster: LocalRedisCluster) -> dict[int, int]:
    """Bytes each running master has received so far (INFO stats): the writes it served.

    Not INFO commandstats: a transaction writes its entities in a few multi-key commands, so a
    command count says how many transactions a master served, not how much it wrote.
    """
    out = {}
    for port in cluster.masters_now():
        with cluster.node_client(port) as node:
            stats = node.info("stats")
        out[port] = int(stats["total_net_input_bytes"])
    return out


def _target(url: str, kafka: tuple[tuple[str, str], ...], dlq: str, shards: int = 0) -> FoldTarget:
    prefix = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    return FoldTarget("order_state", 1, url, prefix, kafka, dlq, shards=shards)


# The variants: where the writer writes, and how many shards (the orders topic's partitions).
_VARIANTS = {"single": 0, "cluster": 0, "sharded": ORDERS_TOPIC.partitions}
_RESULTS = "bench.cluster.windows"  # where --windows' closers emit


def _failover(
    cluster: LocalRedisCluster, records: Sequence[SourceRecord], kafka: Any, dlq: str
) -> float:
    """Seconds from killing the master of a shard's slot until a batch commits again."""
    target = _target(cluster.url, kafka, dlq, shards=ORDERS_TOPIC.partitions)
    client = cast("RedisCluster", redis_client(cluster.url))
    shard = target.keys.for_shard(0).positions
    master = client.get_node_from_key(shard).port  # type: ignore[no-untyped-call]
    writer = FoldWriter(target, OrderStateProjection())
    committed: list[float] = []
    chunks = [records[i : i + 2_000] for i in range(0, len(records), 2_000)]

    def traffic() -> None:
        for batch_id, chunk in enumerate(chunks):
            writer.apply(chunk, batch_id=batch_id)
            committed.append(time.monotonic())

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    while len(committed) < 3 and thread.is_alive():
        time.sleep(0.005)
    cluster.kill(master)
    killed = time.monotonic()
    while thread.is_alive() and not [t for t in committed if t > killed]:
        time.sleep(0.01)
    recovered = next((t - killed for t in committed if t > killed), float("nan"))
    thread.join()
    cluster.restart(master)  # back as a replica of the promoted one
    cluster.wait_ok()
    return recovered


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench cluster``."""
    parser = argparse.ArgumentParser(prog="python -m bench cluster", description=__doc__)
    parser.add_argument("--events", type=int, default=200_000, help="order events applied")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--failovers", type=int, default=2, help="master kills measured")
    parser.add_argument(
        "--windows", action="store_true", help="sales_windows (and its read costs), not order_state"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="refold-bench-cluster-") as tmp:
        state = Path(tmp)
        with (
            LocalStack(state / "stack", free_port(), free_port(), redis_persistent=False) as stack,
            LocalRedisCluster(state, free_port_run(6), persistent=False) as cluster,
        ):
            kafka = (("bootstrap.servers", stack.bootstrap_servers),)
            dlq = "bench.cluster.dlq"
            ensure_topics(
                dict(kafka),
                [
                    ORDERS_TOPIC,
                    TopicSpec(dlq, 1, "(key)", ("(any)",)),
                    effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),
                    results_spec(_RESULTS),
                ],
            )
            produce_orders(stack.bootstrap_servers, args.events)
            records = read_records(stack.bootstrap_servers, ORDERS_TOPIC.name, args.events)
            print(f"backlog: {len(records):,} order events, 8 partitions", flush=True)
            rates: dict[str, list[float]] = {name: [] for name in _VARIANTS}
            calls: dict[str, dict[int, int]] = {"cluster": {}, "sharded": {}}
            reads: dict[str, list[dict[str, float]]] = {name: [] for name in _VARIANTS}
            for round_ in range(args.rounds):
                order = list(_VARIANTS)[round_ % 3 :] + list(_VARIANTS)[: round_ % 3]
                for name in order:
                    url = stack.redis_url if name == "single" else cluster.url
                    if args.windows:
                        target = windows_target(url, kafka, dlq, _VARIANTS[name], ORDERS_TOPIC.name)
                        writer = windows_writer(target)
                    else:
                        target = _target(url, kafka, dlq, _VARIANTS[name])
                        writer = FoldWriter(target, OrderStateProjection())
                    before = _calls(cluster)
                    rates[name].append(len(records) / apply_in_chunks(writer, records))
                    if name in calls:
                        for port, n in _calls(cluster).items():
                            calls[name][port] = calls[name].get(port, 0) + n - before.get(port, 0)
                    if args.windows:
                        reads[name].append(read_costs(target, records, _RESULTS))
                print(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{n} {rates[n][-1]:,.0f} ev/s" for n in _VARIANTS),
                    flush=True,
                )
            recoveries = [_failover(cluster, records, kafka, dlq) for _ in range(args.failovers)]
    _print(rates, calls, recoveries, "sales_windows" if args.windows else "entity fold")
    if args.windows:
        _print_reads(reads)
    return 0


def _print(
    rates: dict[str, list[float]],
    calls: dict[str, dict[int, int]],
    recoveries: list[float],
    fold: str,
) -> None:
    rows = [
        (f"{fold}, single redis-server", _span(rates["single"], "ev/s")),
        (f"{fold}, cluster, one slot", _span(rates["cluster"], "ev/s")),
        (f"{fold}, cluster, 8 shards", _span(rates["sharded"], "ev/s")),
    ]
    for name in ("cluster", "sharded"):
        ratios = [c / s for s, c in zip(rates["single"], rates[name], strict=True)]
        rows.append((f"  {name} / single, same round", f"{min(ratios):.0%}-{max(ratios):.0%}"))
        total = sum(calls[name].values()) or 1
        even = total / max(len(calls[name]), 1)
        rows += [
            (f"  {name}: master :{port} bytes in", f"{n / 1e6:,.1f} MB ({n / even:.2f}x even)")
            for port, n in sorted(calls[name].items())
        ]
    if recoveries:
        rows.append(("failover: a batch commits again after", _span(recoveries, "s", ".1f")))
    width = max(len(r[0]) for r in rows)
    print("\nRedis Cluster (one machine: 3 masters, 3 replicas, the processes share 2 cores)")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    print(
        "  One slot: a generation's keys share one hash tag, so one master serves it. Sharded: "
        "each partition id's keys share its shard's tag, so the masters share the writes."
    )


def _print_reads(reads: dict[str, list[dict[str, float]]]) -> None:
    """The read costs of each variant (us per read; the closer: per window emitted)."""
    labels = {
        "tumbling": "window read, per_minute (1 bucket)",
        "sliding": "window read, 5 min sliding (30 buckets)",
        "distinct_hour": "distinct payment methods over an hour (60 sketches)",
        "closer": "closer, per window emitted",
    }
    print("\nWindow reads, us each (sharded: every bucket and sketch read from 8 shards)")
    width = max(len(v) for v in labels.values())
    for kind, label in labels.items():
        cells = [f"{n} {_span([r[kind] for r in reads[n]], 'us')}" for n in _VARIANTS]
        print(f"  {label:<{width}}  " + ", ".join(cells))
    closed = [int(r["closed"]) for n in _VARIANTS for r in reads[n]]
    print(f"  windows the closer emitted per run: {min(closed):,}-{max(closed):,}")


def _span(values: list[float], unit: str, spec: str = ",.0f") -> str:
    low, high = min(values), max(values)
    return f"{low:{spec}} {unit}" if low == high else f"{low:{spec}}-{high:{spec}} {unit}"
