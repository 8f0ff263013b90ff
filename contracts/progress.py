"""Progress for refold's commands: a bar on a terminal, plain periodic lines everywhere else.

tqdm redraws a bar with carriage returns, so ``make run > log`` filled the log with thousands of
frames. Every bar of refold comes from :func:`progress_bar`: on a terminal it is tqdm's; on
anything else (a pipe, a log file) the same progress is written as whole lines, at most one
every :data:`LINE_INTERVAL_S` seconds, plus the last one: ``rebuilding: 40%|####  | 52k/130k
[00:12<00:18, 4.2kev/s]``.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from tqdm import tqdm

__all__ = ["LINE_INTERVAL_S", "move_to", "progress_bar"]

# Off a terminal: how often a progress line is written (a log gets ~6 lines a minute).
LINE_INTERVAL_S = 10.0


class _Lines:
    """A stream for tqdm off a terminal: each frame becomes one line (no carriage return)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:  # tqdm clears a bar (leave=False) with spaces: nothing to say
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(*iterable: Any, shown: bool = True, **options: Any) -> tqdm[Any]:
    """Progress of ``iterable`` or of ``update`` calls: a bar on a terminal, else lines.

    Args:
        iterable: What to iterate, as tqdm's first argument (optional).
        shown: False hides it everywhere (a ``--no-progress`` option).
        options: tqdm's options (``total``, ``unit``, ``desc``, ``file``...).
    """
    stream = options.pop("file", None) or sys.stderr
    if not shown:
        return tqdm(*iterable, **options, file=stream, disable=True)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return tqdm(*iterable, **{"dynamic_ncols": True, **options}, file=stream)
    lines = {
        **options,
        "file": _Lines(stream),
        "mininterval": LINE_INTERVAL_S,
        "maxinterval": LINE_INTERVAL_S,
        "ascii": True,
        "ncols": 100,
        "dynamic_ncols": False,
    }
    return tqdm(*iterable, **lines)


def move_to(bar: tqdm[Any], done: int, note: str | None = None) -> None:
    """Set ``bar`` to ``done`` (and its note), drawn only as often as the bar draws itself.

    For progress read from somewhere (positions, a rebuild's callback) rather than counted by
    steps. Setting ``bar.n`` and calling ``refresh()`` draws every time: one line per poll in a
    log.
    """
    if note is not None:
        bar.set_postfix_str(note, refresh=False)
    bar.update(done - bar.n)
