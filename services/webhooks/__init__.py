"""Webhook delivery of critical insights: HTTP POST of JSON, at least once, idempotency keys.

See ``docs/webhooks.md``. ``refold webhooks run|log|redrive`` is the command line
(``deploy/webhooks_cli.py``); in Python::

    dispatcher = WebhookDispatcher(settings, kafka, redis_client, key_prefix)
    running = dispatcher.start()  # a background thread
    ...
    running.stop()  # requests in flight finish, the delivered prefix is committed
"""

from refold.services.webhooks.config import WebhookServiceSettings, WebhookSettings, dlq_topic
from refold.services.webhooks.dispatcher import DispatcherStats, WebhookDispatcher
from refold.services.webhooks.store import LogEntry, WebhookStore, list_dispatchers
from refold.services.webhooks.thread import DispatcherThread

__all__ = [
    "DispatcherStats",
    "DispatcherThread",
    "LogEntry",
    "WebhookDispatcher",
    "WebhookServiceSettings",
    "WebhookSettings",
    "WebhookStore",
    "dlq_topic",
    "list_dispatchers",
]
