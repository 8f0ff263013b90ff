"""How every producer refold runs is acknowledged: acks=all and idempotence, said at its start.

The producer SDK (so HTTP ingest) and every output producer (processors' outputs and dead
letters, transactional or not, the webhook dispatcher's dead letters, the archive's and the
API keys' records) take these settings last, over the user's client properties: a record is
acknowledged once every in-sync replica has it (``acks=all``; with a topic's
``min.insync.replicas`` of 2, on two brokers at least), and the retries after a leader moved
neither duplicate nor reorder it (idempotence; a transactional producer is idempotent too).
A client property that asks otherwise is overridden, with a warning that names it.

Each kind of producer says once per process, at its first start, what it uses
(:func:`announce`): the settings above, its transactional id when it has one, and its delivery
timeout. Whether a topic has the replicas to make ``acks=all`` mean something is checked where
refold creates topics (:func:`refold.contracts.kafka.admin.ensure_topics` warns of a topic with
one replica on a cluster of several brokers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["DURABLE", "announce", "delivery_summary", "durable"]

logger = logging.getLogger(__name__)

# What no refold producer may do without: see the module's docstring.
DURABLE: dict[str, str] = {"acks": "all", "enable.idempotence": "true"}
_SAME = {"all": {"all", "-1"}, "true": {"true", "True", "1"}}

_announced: set[str] = set()
_lock = threading.Lock()


def durable(config: Mapping[str, Any], who: str) -> dict[str, Any]:
    """``config`` with :data:`DURABLE` over it; a value it overrides is logged as a warning.

    Args:
        config: The producer's librdkafka settings (defaults, then the user's properties).
        who: Which producer, for the warning ("the producer SDK").
    """
    for key, value in DURABLE.items():
        given = config.get(key)
        if given is not None and str(given) not in _SAME[value]:
            logger.warning(
                "%s: %s=%s in the client properties is overridden with %s=%s (refold's "
                "producers are acknowledged by every in-sync replica, and idempotent)",
                who,
                key,
                given,
                key,
                value,
            )
    return {**config, **DURABLE}


def delivery_summary(config: Mapping[str, Any]) -> str:
    """One line: what a producer with ``config`` uses (pure)."""
    parts = [f"acks={config.get('acks', '(librdkafka default: all)')}"]
    idempotent = str(config.get("enable.idempotence", "false")) in _SAME["true"]
    parts.append("idempotent" if idempotent else "NOT idempotent")
    if config.get("transactional.id"):
        parts.append("transactional")
    timeout = config.get("message.timeout.ms", config.get("delivery.timeout.ms"))
    parts.append(
        f"delivery timeout {int(timeout) / 1000:g} s" if timeout else "delivery timeout 300 s"
    )
    return ", ".join(parts)


def announce(who: str, config: Mapping[str, Any]) -> None:
    """Log, once per process for each ``who``, what that producer uses (INFO)."""
    with _lock:
        if who in _announced:
            return
        _announced.add(who)
    logger.info(
        "%s produces to %s with %s",
        who,
        config.get("bootstrap.servers", "(no bootstrap.servers)"),
        delivery_summary(config),
    )
