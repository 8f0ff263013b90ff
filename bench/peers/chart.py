"""Draw ``bench/results/peers.png`` from ``peers.json``: events/s of each engine, two bars.

Run in ``.venv-peers`` (matplotlib is in the ``peers`` extra): ``python -m bench.peers.chart
IN.json OUT.png``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    source, target = (Path(a) for a in (argv or sys.argv[1:]))
    results = json.loads(source.read_text())
    rows = [(e["label"], e) for e in results["engines"].values() if "rate_steady" in e]
    labels = [label + ("" if e["ok"] else " (state WRONG)") for label, e in rows]
    steady = [(e["rate_steady"] or 0) / 1000 for _l, e in rows]  # None: one batch (Spark)
    wall = [e["rate_wall"] / 1000 for _l, e in rows]
    figure, axes = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    positions = range(len(rows))
    axes.barh([p + 0.2 for p in positions], steady, height=0.4, label="steady")
    axes.barh([p - 0.2 for p in positions], wall, height=0.4, label="including start-up")
    axes.set_yticks(list(positions), labels)
    axes.invert_yaxis()
    axes.set_xlabel("thousand order events per second (higher is better)")
    axes.set_title(
        f"{results['events']:,} order events, 8 partitions, refold's Avro, "
        f"order_state's fold;\n{results['cores']} cores, load average "
        f"{results['load_before'][0]:.1f} at the start"
    )
    axes.legend(loc="upper right")  # beside the short bars of the first rows
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    print(f"chart written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
