"""Progress bars are drawn on a terminal only: a pipe or a log file gets no frames."""

from __future__ import annotations

import io

from contracts.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_and_nowhere_else():
    terminal, log = _Terminal(), io.StringIO()
    assert list(progress_bar(range(3), file=terminal, desc="t")) == [0, 1, 2]
    assert list(progress_bar(range(3), file=log, desc="t")) == [0, 1, 2]
    hidden = _Terminal()
    with progress_bar(total=3, file=hidden, shown=False) as bar:
        bar.update(3)
    assert "\r" in terminal.getvalue()
    assert log.getvalue() == ""
    assert hidden.getvalue() == ""
