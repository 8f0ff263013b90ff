"""librdkafka's own log lines, through Python's logging (one format with everything else).

Without a ``logger`` in its configuration librdkafka writes ``%3|1795699963.035|FAIL|rdkafka#
producer-1| ...`` lines to stderr in a format of its own, which no handler, level or JSON
formatter of refold's applies to. :func:`routed` adds the logger ``refold.librdkafka`` to a
client's configuration; confluent-kafka maps librdkafka's syslog levels to logging levels and
delivers the records while the client is polled (produce/flush, consume).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["LIBRDKAFKA_LOGGER", "routed"]

LIBRDKAFKA_LOGGER = logging.getLogger("refold.librdkafka")


def routed(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with librdkafka's logs routed to :data:`LIBRDKAFKA_LOGGER`.

    Not picklable (a logger object): call it where the client is made, never on a
    configuration that is shipped to Spark's executors.
    """
    return {**config, "logger": LIBRDKAFKA_LOGGER}
