"""A webhook dispatcher running in a background thread (the demo's and the tests' handle)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refold.services.webhooks.dispatcher import WebhookDispatcher

__all__ = ["DispatcherThread"]

logger = logging.getLogger(__name__)


class DispatcherThread:
    """A dispatcher running in a background thread (the demo's and the tests' handle).

    Args:
        dispatcher: The dispatcher to run.
    """

    def __init__(self, dispatcher: WebhookDispatcher) -> None:
        self.dispatcher = dispatcher
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"webhooks {dispatcher.settings.name}", daemon=True
        )

    def _run(self) -> None:
        try:
            self.dispatcher.run()
        except BaseException as exc:  # kept for stop() / the caller to raise
            self.error = exc
            logger.exception("webhook dispatcher %s stopped", self.dispatcher.settings.name)

    def start(self) -> DispatcherThread:
        """Start the thread."""
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """True while the dispatcher runs."""
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (e.g. an ``until_end`` run); raise its error if any."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop the dispatcher and wait for it; raise the error it stopped with, if any."""
        self.dispatcher.stop()
        self.join(timeout)

    def __enter__(self) -> DispatcherThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
