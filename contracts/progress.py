"""Progress bars for refold's commands: drawn on a terminal, left out of pipes and log files.

tqdm redraws a bar with carriage returns, so ``make run > log`` filled the log with thousands of
frames. Every bar of refold comes from :func:`progress_bar`: on a terminal it is tqdm's; on
anything else it is off (``disable=None``, tqdm's own TTY check), and the commands' log lines
say what happened.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(*iterable: Any, shown: bool = True, **options: Any) -> tqdm[Any]:
    """A tqdm bar (``dynamic_ncols``) when stderr is a terminal and ``shown``; else a silent one.

    Args:
        iterable: What to iterate, as tqdm's first argument (optional).
        shown: False hides it everywhere (a ``--no-progress`` option).
        options: tqdm's options (``total``, ``unit``, ``desc``...).
    """
    return tqdm(*iterable, **{"dynamic_ncols": True, **options, "disable": None if shown else True})
