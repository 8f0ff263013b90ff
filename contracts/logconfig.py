"""Logging set-up for deployables: JSON lines with refold's context fields."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

__all__ = ["CONTEXT_FIELDS", "configure_logging"]

CONTEXT_FIELDS = (
    "topic",
    "partition",
    "offset",
    "batch_id",
    "consumer_group",
    "generation",
    "processor",
)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO", *, json_lines: bool = True) -> None:
    """Install one stderr handler on the root logger; call once, from ``__main__``.

    Args:
        level: Root log level.
        json_lines: JSON lines (services) or plain text (interactive CLIs).
    """
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
