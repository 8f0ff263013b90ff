"""The three kinds of pattern: their declarations and how each matches settled events.

:class:`Sequence`, :class:`CountWithin` and :class:`Absence` are frozen declarations (checked
when built); :func:`run_sequence`, :func:`run_count` and :func:`run_absence` match one key's
settled events, in order, against one pattern's open state and return the new open state and
the matches. :class:`~refold.processors.fold.patterns.PatternProjection` settles the events and
turns matches into insights (see :mod:`refold.processors.fold.patterns` for the semantics).

Pure (no I/O; picklable: shipped to Spark executors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.matching import On

__all__ = [
    "Absence",
    "CountWithin",
    "Entry",
    "Match",
    "Pattern",
    "PatternConfigError",
    "Sequence",
    "raise_if_problems",
    "run_absence",
    "run_count",
    "run_sequence",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Open partial sequences and armed deadlines kept per key and pattern. A key with more starts
# than this inside one window drops its oldest (closest to expiring); 16 is far above what an
# order or a customer does within a pattern's window, and keeps a hostile key's state small.
_MAX_OPEN = 16

Entry = list[Any]  # a buffered event: [time, event type, ref, digest, {field: value}]


class PatternConfigError(ProcessorConfigError):
    """A pattern or pattern processor is declared wrongly (found when the fold is built)."""

    code = "PATTERN_CONFIG"


def _check(name: str, within_ms: int, severity: str) -> list[str]:
    problems = []
    if not _NAME.match(name):
        problems.append(f"pattern name {name!r} must be lower case letters, digits and _")
    if within_ms < 0:
        problems.append(f"{name}: within_ms must be >= 0")
    if not severity:
        problems.append(f"{name}: severity is empty")
    return problems


def raise_if_problems(problems: list[str]) -> None:
    """Raise :class:`PatternConfigError` naming every problem, if there is one."""
    if problems:
        raise PatternConfigError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class Sequence:
    """Its steps in event-time order, the last at most ``within_ms`` after the first.

    Skip-till-next-match: events between the steps are ignored. An event matching the first
    step opens a partial match; each later event moves the oldest partial whose next step it
    matches (an event serves at most one partial; one that serves none and matches the first
    step opens a new one). A partial completes into a match and is consumed; it expires when an
    event beyond its window would be needed. At most ``max_open`` partials per key (the oldest
    is dropped).
    """

    name: str
    steps: tuple[On, ...]
    within_ms: int
    severity: str = "critical"
    description: str = ""
    max_open: int = _MAX_OPEN
    kind: ClassVar[str] = "sequence"

    def __post_init__(self) -> None:
        problems = _check(self.name, self.within_ms, self.severity)
        if len(self.steps) < 2:
            problems.append(f"{self.name}: a sequence needs at least two steps")
        if self.max_open < 1:
            problems.append(f"{self.name}: max_open must be >= 1")
        raise_if_problems(problems)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return self.steps

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {"steps": " -> ".join(s.label for s in self.steps), "within_ms": str(self.within_ms)}


@dataclass(frozen=True, slots=True)
class CountWithin:
    """``count`` events matching ``on`` with the last at most ``within_ms`` after the first.

    The events of a match are consumed: counting starts over after it, so 3 cancellations give
    one match, and a 4th needs two more within its own window for the next one (6 within the
    window: two matches). Events older than ``within_ms`` before a new one stop counting.
    """

    name: str
    on: On
    count: int
    within_ms: int
    severity: str = "critical"
    description: str = ""
    kind: ClassVar[str] = "count"

    def __post_init__(self) -> None:
        problems = _check(self.name, self.within_ms, self.severity)
        if self.count < 1:
            problems.append(f"{self.name}: count must be >= 1")
        raise_if_problems(problems)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return (self.on,)

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {"on": self.on.label, "count": str(self.count), "within_ms": str(self.within_ms)}


@dataclass(frozen=True, slots=True)
class Absence:
    """An ``after`` event not followed by any ``expect`` event within ``within_ms``.

    Each ``after`` at ``t`` arms a deadline at ``t + within_ms``. An ``expect`` event at a time
    in ``[t, t + within_ms]`` disarms it (every deadline armed when it comes). A deadline fires,
    once the watermark is above it, as a match detected at the deadline. An event that is both
    is an ``expect`` first. At most ``max_open`` armed deadlines per key (the oldest is
    dropped).
    """

    name: str
    after: On
    expect: On | tuple[On, ...]
    within_ms: int
    severity: str = "critical"
    description: str = ""
    max_open: int = _MAX_OPEN
    kind: ClassVar[str] = "absence"

    def __post_init__(self) -> None:
        if isinstance(self.expect, On):
            object.__setattr__(self, "expect", (self.expect,))
        problems = _check(self.name, self.within_ms, self.severity)
        if not self.expect:
            problems.append(f"{self.name}: an absence needs at least one expected event")
        if self.max_open < 1:
            problems.append(f"{self.name}: max_open must be >= 1")
        raise_if_problems(problems)

    @property
    def expected(self) -> tuple[On, ...]:
        """The events that disarm it."""
        return self.expect if isinstance(self.expect, tuple) else (self.expect,)

    @property
    def ons(self) -> tuple[On, ...]:
        """Every event description it matches."""
        return (self.after, *self.expected)

    def details(self) -> dict[str, str]:
        """What every insight of it says about it."""
        return {
            "after": self.after.label,
            "expect": " | ".join(e.label for e in self.expected),
            "within_ms": str(self.within_ms),
        }


Pattern = Sequence | CountWithin | Absence
Match = tuple[int, int, list[str], dict[str, str]]  # detected_at, first_at, refs, details


def run_sequence(
    p: Sequence, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[Match]]:
    """Partials are ``[start, next step, [refs]]``, oldest first."""
    partials = [list(x) for x in open_]
    found: list[Match] = []
    for t, event_type, ref, _digest, fields in events:
        partials = [x for x in partials if t - x[0] <= p.within_ms]
        taken = False
        for i, (start, step, refs) in enumerate(partials):
            if p.steps[step].matches(event_type, fields):
                taken = True
                if step + 1 == len(p.steps):
                    found.append((t, start, [*refs, ref], {}))
                    del partials[i]
                else:
                    partials[i] = [start, step + 1, [*refs, ref]]
                break
        if not taken and p.steps[0].matches(event_type, fields):
            partials = [*partials, [t, 1, [ref]]][-p.max_open :]
    # No event at or above the watermark can complete a partial whose window ends below it.
    return [x for x in partials if x[0] + p.within_ms >= watermark], found


def run_count(
    p: CountWithin, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[Match]]:
    """Counted events are ``[time, ref]``, oldest first (fewer than ``count``)."""
    recent = [list(x) for x in open_]
    found: list[Match] = []
    for t, event_type, ref, _digest, fields in events:
        if not p.on.matches(event_type, fields):
            continue
        recent = [x for x in recent if t - x[0] <= p.within_ms]
        recent.append([t, ref])
        if len(recent) >= p.count:
            found.append((t, recent[0][0], [r for _t, r in recent], {}))
            recent = []
    return [x for x in recent if x[0] + p.within_ms >= watermark], found


def run_absence(
    p: Absence, open_: list[Any], events: list[Entry], watermark: int
) -> tuple[list[Any], list[Match]]:
    """Armed deadlines are ``[deadline, after time, ref]``, in deadline order."""
    armed = [list(x) for x in open_]
    found: list[Match] = []
    expect_at: int | None = None  # the latest expect settled in this pass

    def fire_below(limit: int) -> None:
        while armed and armed[0][0] < limit:
            deadline, at, ref = armed.pop(0)
            found.append((deadline, at, [ref], {"deadline": str(deadline)}))

    for t, event_type, ref, _digest, fields in events:
        fire_below(t)  # an expect exactly at a deadline still counts: events at t come first
        if any(e.matches(event_type, fields) for e in p.expected):
            armed, expect_at = [], t
        # An expect at the same time as the after disarms it, whichever sorts first. One
        # pass settles every event of a time together, so expect_at never outlives it.
        if p.after.matches(event_type, fields) and expect_at != t:
            armed = [*armed, [t + p.within_ms, t, ref]][-p.max_open :]
    fire_below(watermark)
    return armed, found
