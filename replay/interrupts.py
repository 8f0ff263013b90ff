"""SIGTERM and SIGINT as exceptions, so that a replay stops what it started before it exits.

Python's default SIGTERM disposition ends the process at once, without running ``finally``
blocks: a replay stopped by ``kill``, a CI timeout or a service manager would leave its rebuild
processor (and the processor's JVM and Python workers) running. Inside an
:class:`InterruptGuard`, SIGTERM and SIGINT raise :class:`InterruptedBySignalError` in the main
thread instead, and the caller's ``finally`` blocks stop what it started.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

__all__ = ["InterruptGuard", "InterruptedBySignalError"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class InterruptedBySignalError(KeyboardInterrupt):
    """Raised by :class:`InterruptGuard`'s handler: SIGTERM or SIGINT asked the replay to stop.

    A ``KeyboardInterrupt`` (not an ``Exception``), so that no ``except Exception`` on the way
    swallows it. It never leaves :mod:`replay`: the code that installed the guard turns it
    into :class:`~refold.replay.errors.ReplayInterruptedError` once it has stopped what it started.

    Attributes:
        signal_number: The signal received.
    """

    def __init__(self, signal_number: int) -> None:
        self.signal_number = signal_number
        super().__init__(f"{signal.Signals(signal_number).name} received")


class InterruptGuard:
    """While active (``with``), SIGTERM and SIGINT raise :class:`InterruptedBySignalError`.

    Lifecycle: installs its handlers on ``__enter__`` and restores the previous ones on
    ``__exit__``; main thread only (Python runs signal handlers there); entered from another
    thread it changes nothing. Not reentrant.

    The first signal raises, at once, unless it arrives inside :meth:`held` (a step that must
    not be torn apart, such as starting a process or the alias flip) or after :meth:`hold`
    (the cleanup): there it is only recorded (:attr:`signal_number`), and :meth:`check`
    raises it afterwards. A second signal never
    raises (the cleanup the first one started must finish); it calls ``on_repeat`` instead,
    e.g. to kill what is being stopped without waiting for its grace period.

    Attributes:
        signal_number: The first signal received, None while none was.
        on_repeat: Called (in the main thread) on every signal after the first.
    """

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self.on_repeat: Callable[[], None] | None = None
        self._holding = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not the main thread: SIGTERM and SIGINT keep their handlers")
            return self
        for signum in _SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self._holding = False

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_number is not None:
            logger.warning("%s received again while stopping", signal.Signals(signum).name)
            if self.on_repeat is not None:
                self.on_repeat()
            return
        self.signal_number = signum
        logger.warning("%s received: stopping", signal.Signals(signum).name)
        if not self._holding:
            raise InterruptedBySignalError(signum)

    def hold(self) -> None:
        """From now until the guard ends, a first signal is recorded instead of raised."""
        self._holding = True

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside, a first signal is recorded instead of raised (see :meth:`check`)."""
        holding, self._holding = self._holding, True
        try:
            yield
        finally:
            self._holding = holding

    def check(self) -> None:
        """Raise the signal received so far, if any.

        Raises:
            InterruptedBySignalError: A signal was received (inside :meth:`held`).
        """
        if self.signal_number is not None:
            raise InterruptedBySignalError(self.signal_number)
