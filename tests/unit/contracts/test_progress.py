"""Progress: a bar on a terminal; whole lines (no carriage returns) in a pipe or a log file."""

from __future__ import annotations

import io

from refold.contracts.progress import move_to, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_on_a_terminal_lines_in_a_log_and_nothing_when_hidden():
    terminal, log = _Terminal(), io.StringIO()
    assert list(progress_bar(range(3), file=terminal, desc="t")) == [0, 1, 2]
    assert list(progress_bar(range(3), file=log, desc="t", unit="ev")) == [0, 1, 2]
    hidden = _Terminal()
    with progress_bar(total=3, file=hidden, shown=False) as bar:
        bar.update(3)
    assert "\r" in terminal.getvalue()
    assert "\r" not in log.getvalue()
    lines = log.getvalue().splitlines()
    # The first frame and the last: the rest is at most one line per LINE_INTERVAL_S.
    assert lines[0].startswith("t:   0%")
    assert lines[-1].startswith("t: 100%")
    assert "3/3" in lines[-1]
    assert len(lines) <= 3
    assert hidden.getvalue() == ""


def test_a_bar_that_is_not_left_behind_leaves_no_blank_line():
    log = io.StringIO()
    with progress_bar(total=2, file=log, desc="backfill", leave=False) as bar:
        bar.update(2)
    assert all(line.strip() for line in log.getvalue().splitlines())


def test_progress_read_from_somewhere_draws_as_seldom_as_counted_progress():
    # The demo and replay set a bar to positions they poll, four times a second.
    log = io.StringIO()
    with progress_bar(total=400, file=log, desc="archive") as bar:
        for done in range(1, 401):
            move_to(bar, done, f"lag {400 - done}")
    lines = log.getvalue().splitlines()
    assert len(lines) <= 3
    assert "400/400" in lines[-1]
    assert "lag 0" in lines[-1]
