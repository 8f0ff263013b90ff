"""``python -m bench peers``: one backlog at three sizes, every engine in turn, one table each.

See :mod:`bench.peers` and docs/performance.md ("refold and its peers"). The topic grows to
each size in turn (200k, 1M, 5M events by default) and every engine folds it from its start,
on an empty Redis, with consumer groups and work folders of that size. Prints a table per
size and the curve, writes ``bench/results/peers.json`` and draws ``bench/results/peers.png``
from it (:mod:`bench.peers.chart`, in ``.venv-peers`` where matplotlib is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.backlog import ORDERS_TOPIC, produce_order_steps
from bench.catch_up import Run, Watched, run_catch_up
from bench.peers.engines import ENGINES, NOTIFICATIONS, Engine, Job, spark_processor
from bench.peers.latency import measure_engine_latency, why_no_latency
from bench.peers.measure import measure
from bench.peers.oracle import compare, log_events, oracle_states
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.store.connect import redis_client
from refold.contracts.topics import TopicSpec, effects_spec
from refold.deploy.local_stack import LocalStack, free_port
from refold.processors.order_state.projection import DEFAULT_NOTIFICATIONS_TOPIC

RESULTS = Path(__file__).parent.parent / "results" / "peers.json"
ROOT = Path(__file__).parent.parent.parent


def _spark(job: Job) -> dict[str, Any]:
    """refold's Spark processor catching up (``--available-now``), as ``make bench`` runs it."""
    process, registry = spark_processor(
        job, f"peers-spark{job.run}", f"spark{job.run}.log", available_now=True
    )
    started = time.time()
    run = run_catch_up([Run(process, (Watched("order_state", registry, job.events),))], "spark")
    result = run.processors["order_state"]
    live = registry.live()
    states = job.refold_states(registry.keys(live or 1).base)
    return {
        # After batch 0; None when batch 0 was the whole backlog (no steady state to measure).
        "rate_steady": result.rate_steady or None,
        "rate_wall": result.events / result.done_s,
        "caught_up_s": result.done_s,
        "cpu_s": run.cpu_s,
        "peak_rss_mb": run.peak_rss_mb,
        "batch0_s": result.batch0_s,
        "batch0_events": result.batch0_events,
        "started": started,
        "states": states,
    }


def _latency(engine: Engine, job: Job, args: argparse.Namespace) -> dict[str, Any]:
    """The engine's produce -> state latency (:mod:`bench.peers.latency`), or why there is none."""
    why = "skipped (--skip-latency)" if args.skip_latency else why_no_latency(engine)
    if why:
        return {"latency_skipped": why}
    try:
        result, missing = measure_engine_latency(
            engine, job, rate=args.rate, seconds=args.latency_seconds, warmup=args.warmup_seconds
        )
    except RuntimeError as exc:
        print(f"  {engine.label}: the latency run failed: {exc}", flush=True)
        return {"latency_error": f"FAILED: {str(exc)[:200]}"}
    print(
        f"  {engine.label}: latency at {args.rate:,} ev/s p50 {result.p50:,.0f} ms, "
        f"p99 {result.p99:,.0f} ms ({result.events:,} orders, {missing} never seen)",
        flush=True,
    )
    return {
        "latency": {
            "rate": args.rate,
            "orders": result.events,
            "missing": missing,
            "p50_ms": result.p50,
            "p95_ms": result.p95,
            "p99_ms": result.p99,
            "max_ms": result.max,
        }
    }


def _run(engine: Engine, job: Job, args: argparse.Namespace) -> dict[str, Any]:
    """One engine: measured, stopped, its final states checked; then its latency run."""
    if engine.name == "refold-spark":
        out = _spark(job)
        got = out.pop("states")
        out.pop("started")
    else:
        missing = engine.missing(job)
        if missing:
            return {"skipped": missing}
        processes, progress = engine.processes(job)
        measured = measure(
            processes,
            progress,
            job.partition_ends,
            engine.label,
            ends_itself=engine.ends_itself,
            stop_grace_s=30.0 if engine.redis else 300.0,  # a states file is written at exit
        )
        out = {
            "rate_steady": measured.rate_steady,
            "rate_wall": measured.rate_wall,
            "caught_up_s": measured.done - measured.started,
            "cpu_s": measured.cpu_s,
            "peak_rss_mb": measured.peak_rss_mb,
            "startup_s": measured.first - measured.started,
        }
        got = engine.states(job)
    verdict = compare(job.expected, got)
    out["correct"] = str(verdict)
    out["ok"] = verdict.ok
    out["cpu_s_per_million"] = out["cpu_s"] / job.events * 1e6
    print(f"  {engine.label}: {out['rate_wall']:,.0f} ev/s incl. start-up, {verdict}", flush=True)
    out.update(_latency(engine, job, args))
    return out


def _table(results: dict[str, dict[str, Any]]) -> str:
    """One size's table: an engine a row."""
    header = (
        "engine",
        "steady ev/s",
        "incl. start-up",
        "caught up",
        "CPU-s / 1M ev",
        "peak RSS",
        "p50 / p99 latency",
        "state",
    )
    rows = [header]
    for engine in ENGINES:
        out = results.get(engine.name)
        if out is None:
            continue
        if "skipped" in out or "error" in out:
            why = out.get("skipped") or out["error"]
            rows.append((engine.label, "-", "-", "-", "-", "-", "-", why))
            continue
        steady = out["rate_steady"]
        latency = out.get("latency")
        rows.append(
            (
                engine.label,
                "one batch" if steady is None else f"{steady:,.0f}",
                f"{out['rate_wall']:,.0f}",
                f"{out['caught_up_s']:,.1f} s",
                f"{out['cpu_s_per_million']:,.0f}",
                f"{out['peak_rss_mb']:,.0f} MB",
                (
                    f"{latency['p50_ms']:,.0f} / {latency['p99_ms']:,.0f} ms"
                    if latency is not None
                    else ("FAILED" if "latency_error" in out else "-")
                ),
                out["correct"],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    )


def _chart(path: Path) -> None:
    python = os.environ.get("REFOLD_PEERS_PYTHON", str(ROOT / ".venv-peers" / "bin" / "python"))
    if not Path(python).exists():
        print("no chart: .venv-peers is missing (make setup)")
        return
    subprocess.run(
        [python, "-m", "bench.peers.chart", str(path), str(path.with_suffix(".png"))],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _curve(runs: dict[int, dict[str, dict[str, Any]]], field: str) -> str:
    """``field`` (a rate) of each engine at each size, with refold Spark's as a ratio to it."""
    sizes = sorted(runs)
    rows = [("engine", *(f"{size:,} events" for size in sizes))]
    for engine in ENGINES:
        cells = []
        for size in sizes:
            out = runs[size].get(engine.name) or {}
            rate, spark = out.get(field), runs[size].get("refold-spark", {}).get(field)
            if rate is None:
                cells.append("one batch" if "rate_wall" in out else "-")
                continue
            ratio = (
                f" (refold {spark / rate:.2f}x)" if spark and engine.name != "refold-spark" else ""
            )
            cells.append(f"{rate:,.0f}{ratio}" + ("" if out.get("ok") else " WRONG"))
        if any(cell != "-" for cell in cells):
            rows.append((engine.label, *cells))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    )


def _one_size(
    stack: LocalStack, events: int, work: Path, chosen: list[Engine], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Every chosen engine over the topic's first ``events`` records, on an empty Redis."""
    kafka = {"bootstrap.servers": stack.bootstrap_servers}
    offsets = LogOffsets(kafka)
    try:
        ends = offsets.end_offsets([(ORDERS_TOPIC.name, p) for p in range(ORDERS_TOPIC.partitions)])
    finally:
        offsets.close()
    redis_client(stack.redis_url).flushdb()  # no positions or states of a smaller size
    print(f"{events:,} events: the oracle reads the backlog back and folds it ...", flush=True)
    expected = oracle_states(log_events(stack.bootstrap_servers, ends))
    folder = work / f"size-{events}"
    job = Job(stack.bootstrap_servers, stack.redis_url, ORDERS_TOPIC.name, ends, events, folder)
    job.expected, job.run = expected, f"-{events}"
    results: dict[str, dict[str, Any]] = {}
    for engine in chosen:
        try:
            results[engine.name] = _run(engine, job, args)
        except RuntimeError as exc:
            print(f"  {engine.label} failed: {exc}", flush=True)
            results[engine.name] = {"error": f"FAILED to run: {str(exc)[:200]}"}
    print(f"\n{events:,} events:\n{_table(results)}\n", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__)
    parser.add_argument(
        "--sizes",
        default="200000,1000000,5000000",
        help="backlog sizes, comma-separated: the topic grows to each in turn",
    )
    parser.add_argument("--events", type=int, help="one size only (--sizes N)")
    parser.add_argument(
        "--engines",
        default=",".join(e.name for e in ENGINES),
        help="comma-separated, of: " + ", ".join(e.name for e in ENGINES),
    )
    parser.add_argument("--work-dir", type=Path, help="keep state and logs here")
    parser.add_argument("--skip-latency", action="store_true", help="no latency runs")
    parser.add_argument("--rate", type=int, default=5000, help="latency runs: events/s")
    parser.add_argument(
        "--latency-seconds", type=float, default=20.0, help="latency runs: seconds counted"
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="latency runs: seconds at the same rate before the counted ones",
    )
    args = parser.parse_args(argv)
    sizes = [args.events] if args.events else sorted({int(n) for n in args.sizes.split(",")})
    load = os.getloadavg()
    chosen = [e for e in ENGINES if e.name in args.engines.split(",")]
    unknown = set(args.engines.split(",")) - {e.name for e in ENGINES}
    if unknown:
        parser.error(f"unknown engines: {', '.join(sorted(unknown))}")
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    with (
        contextlib.nullcontext(str(args.work_dir))
        if args.work_dir is not None
        else tempfile.TemporaryDirectory(prefix="refold-bench-peers-")
    ) as tmp:
        work = Path(tmp)
        with LocalStack(work / "stack", free_port(), free_port(), redis_persistent=False) as stack:
            topic = ORDERS_TOPIC
            ensure_topics(
                {"bootstrap.servers": stack.bootstrap_servers},
                [
                    topic,
                    TopicSpec(f"{topic.name}.dlq", 1, "(key)", ("(any)",)),
                    effects_spec(NOTIFICATIONS),  # order_state's shipping notices
                    effects_spec(DEFAULT_NOTIFICATIONS_TOPIC),  # the same, from the baseline
                ],
            )
            for index, events in enumerate(produce_order_steps(stack.bootstrap_servers, sizes)):
                # Latency does not depend on the backlog: measured once, with the first size.
                args.skip_latency = args.skip_latency or index > 0
                runs[events] = _one_size(stack, events, work, chosen, args)
    for events, results in runs.items():
        print(f"\n{events:,} events:\n{_table(results)}")
    print(f"\nsteady ev/s, every size:\n{_curve(runs, 'rate_steady')}")
    print(f"\nev/s including start-up, every size:\n{_curve(runs, 'rate_wall')}")
    RESULTS.parent.mkdir(exist_ok=True)
    labels = {e.name: {"label": e.label, "guarantee": e.guarantee} for e in ENGINES}
    RESULTS.write_text(
        json.dumps(
            {
                "sizes": sorted(runs),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "load_before": load,
                "runs": {
                    str(events): {name: {**labels[name], **out} for name, out in results.items()}
                    for events, results in runs.items()
                },
            },
            indent=2,
        )
    )
    print(f"\nresults written to {RESULTS}")
    _chart(RESULTS)
    return (
        0
        if all(out.get("ok", "skipped" in out) for r in runs.values() for out in r.values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
