"""Draw ``bench/results/peers.png`` from ``peers.json``: each engine's rate against backlog size.

Run in ``.venv-peers`` (matplotlib is in the ``peers`` extra): ``python -m bench.peers.chart
IN.json OUT.png``. Two panels: steady events/s (start-up left out) and events/s including
start-up, a line per engine over the sizes of the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    source, target = (Path(a) for a in (argv or sys.argv[1:]))
    results = json.loads(source.read_text())
    sizes = results["sizes"]
    engines: dict[str, str] = {}
    for run in results["runs"].values():
        for name, out in run.items():
            engines.setdefault(name, out["label"])
    figure, panels = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    colors = plt.get_cmap("tab20").colors  # more engines than the default cycle's 10 colours
    for panel, field, title in (
        (panels[0], "rate_steady", "steady (start-up left out)"),
        (panels[1], "rate_wall", "including start-up"),
    ):
        for index, (name, label) in enumerate(engines.items()):
            points = [
                (size, out[field] / 1000)
                for size in sizes
                if (out := results["runs"][str(size)].get(name)) and out.get(field)
            ]
            if not points:
                continue
            wrong = any(not results["runs"][str(s)][name].get("ok") for s, _r in points)
            style = "-o" if name.startswith("refold") else "--o"
            panel.plot(
                *zip(*points, strict=True),
                style,
                color=colors[index % len(colors)],
                linewidth=2.5 if name.startswith("refold") else 1.5,
                label=label + (" (WRONG)" if wrong else ""),
            )
        panel.set_xscale("log")
        panel.xaxis.set_minor_locator(NullLocator())
        panel.set_xticks(sizes, [f"{s / 1e6:g}M" if s >= 1e6 else f"{s // 1000}k" for s in sizes])
        panel.set_xlabel("backlog, order events (8 partitions)")
        panel.set_title(title)
        panel.grid(alpha=0.3)
    panels[0].set_ylabel("thousand events per second (higher is better)")
    panels[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    figure.suptitle(
        f"order_state's fold on {results['cores']} cores; load average "
        f"{results['load_before'][0]:.1f} at the start"
    )
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    print(f"chart written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
