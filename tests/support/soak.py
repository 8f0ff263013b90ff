"""``make soak``: every fault scenario, big, on private stacks; prints the fault table.

Usage: ``python -m tests.support.soak [--orders N] [--kills K] [--outage S] [--only NAME]``.
The defaults produce ~1M events (100k orders) and 50 kill -9s; the table is also written as
Markdown to ``--out`` (default ``.state/soak.md``) for docs/reliability.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.support import faults

__all__ = ["main"]


def _row(result: faults.FaultResult, seconds: float) -> str:
    return (
        f"| {result.fault} | {result.events:,} | {result.lost} | {result.applied_twice} | "
        f"{result.recovery_s:.1f} s | {'yes' if result.state_equal else 'NO'} | "
        f"{'yes' if result.group_equal else 'NO'} | {seconds:.0f} s |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios; exit 1 when any of them lost or doubled anything."""
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__)
    parser.add_argument("--orders", type=int, default=100_000, help="orders (~10 events each)")
    parser.add_argument("--kills", type=int, default=50, help="kill -9s of the processor")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds Redis/broker are away")
    parser.add_argument("--only", choices=sorted(faults.SCENARIOS), action="append")
    parser.add_argument("--out", type=Path, default=Path(".state/soak.md"))
    args = parser.parse_args(argv)
    header = (
        "| fault | events | lost | applied twice | recovery | state == oracle | "
        "group == positions | run time |\n|---|---|---|---|---|---|---|---|"
    )
    rows = []
    failed = False
    sizes = {
        "kill-9-soak": {"orders": args.orders, "kills": args.kills},
        "redis-older-rdb": {"orders": max(1000, args.orders // 10)},
        "redis-empty": {"orders": max(1000, args.orders // 10)},
        "redis-unreachable": {"orders": max(1000, args.orders // 10), "outage_s": args.outage},
        "broker-unreachable": {"orders": max(1000, args.orders // 10), "outage_s": args.outage},
        "broker-killed": {"orders": max(1000, args.orders // 10), "down_s": 10.0},
    }
    print(header, flush=True)
    for name, scenario in faults.SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"soak-{name}-") as work:
            try:
                result = scenario(Path(work), **sizes[name])
            except AssertionError as exc:
                result = faults.FaultResult(name, 0, notes=[f"failed: {exc}"[:500]])
        row = _row(result, time.monotonic() - started)
        failed |= not result.ok
        rows.append(row)
        print(row, *(f"  note: {n}" for n in result.notes), sep="\n", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + "\n" + "\n".join(rows) + "\n")
    print(f"table written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
