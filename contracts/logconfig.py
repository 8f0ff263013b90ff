"""Logging set-up for deployables: one format per process, JSON for machines, plain for people.

Every refold process (a processor, its Spark executors' Python workers, ``refold serve`` with
uvicorn's own lines, the webhook dispatcher, ``replay``) logs through the one handler
:func:`configure_logging` installs on the root logger, in the format its ``--log-format`` (or
``REFOLD_LOG_FORMAT``) names:

- ``plain`` (the default): ``2025-05-01 12:00:03 WARNING refold.x: message [generation=3]``, one
  line per record, for a person at a terminal or reading a log file. The default because refold
  is first run by people, from a terminal (``refold up``, ``refold demo``); a collector is
  configured once, by whoever deploys it (``deploy/compose.yaml`` sets ``json``).
- ``json``: one JSON object per line, ``{ts, level, logger, msg}`` and the context fields
  (:data:`CONTEXT_FIELDS`), for a log collector.

A traceback belongs to an error: on a record below ERROR (a warning about a retry, an outage)
only the exception's type and message are kept (``exc``), unless the level is DEBUG.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, cast, get_args

__all__ = [
    "CONTEXT_FIELDS",
    "LOG_FORMAT_ENV",
    "LOG_LEVEL_ENV",
    "LogFormat",
    "add_log_format_argument",
    "configure_logging",
    "log_format_in_use",
]

LogFormat = Literal["plain", "json"]
LOG_FORMAT_ENV = "REFOLD_LOG_FORMAT"
LOG_LEVEL_ENV = "REFOLD_LOG_LEVEL"

CONTEXT_FIELDS = (
    "topic",
    "partition",
    "offset",
    "batch_id",
    "consumer_group",
    "generation",
    "processor",
)


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The record's exception: a traceback at ERROR and above (or DEBUG), else one line."""
    if not record.exc_info or record.exc_info[1] is None:
        return None
    if record.levelno >= logging.ERROR or logging.getLogger().isEnabledFor(logging.DEBUG):
        return formatter.formatException(record.exc_info)
    exc = record.exc_info[1]
    return f"{type(exc).__name__}: {exc}"


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
        exc = _exception_text(self, record)
        if exc is not None:
            entry["exc"] = exc
        return json.dumps(entry, default=str)


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self.formatTime(record, '%Y-%m-%d %H:%M:%S')} {record.levelname} "
            f"{record.name}: {record.getMessage()}"
        )
        context = [
            f"{field}={getattr(record, field)}"
            for field in CONTEXT_FIELDS
            if getattr(record, field, None) is not None
        ]
        if context:
            line += f" [{' '.join(context)}]"
        exc = _exception_text(self, record)
        if exc is None:
            return line
        return f"{line}\n{exc}" if "\n" in exc else f"{line} ({exc})"


_FORMATTERS: dict[str, type[logging.Formatter]] = {"plain": _PlainFormatter, "json": _JsonFormatter}


def add_log_format_argument(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> argparse.Action:
    """Add ``--log-format {plain,json}``, defaulting to ``$REFOLD_LOG_FORMAT`` or ``plain``.

    Args:
        parser: The command's parser (called from its ``__main__`` side).
        environ: The environment to take the default from.
    """
    # A misspelt variable is not checked here (argparse checks only what is typed):
    # configure_logging refuses it, naming the variable.
    return parser.add_argument(
        "--log-format",
        choices=list(get_args(LogFormat)),
        default=environ.get(LOG_FORMAT_ENV, "plain"),
        help=f"plain lines for people (default) or JSON lines for a log collector "
        f"(env {LOG_FORMAT_ENV})",
    )


def log_format_in_use() -> LogFormat:
    """The format :func:`configure_logging` installed (``plain`` if it was not called).

    Read by what starts other loggers of the same process (Spark's JVM, its Python workers),
    so that they write the same format.
    """
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, _JsonFormatter):
            return "json"
    return "plain"


def configure_logging(
    level: str = "INFO",
    *,
    log_format: str = "plain",
    environ: MutableMapping[str, str] | None = None,
    record_level: bool = False,
) -> None:
    """Install one stderr handler on the root logger; call once, from ``__main__``.

    Args:
        level: Root log level (``INFO``, ``warning``...).
        log_format: ``plain`` (people) or ``json`` (machines).
        environ: The process's environment (``os.environ``), to record the format in, so
            the processes it starts log the same way: Spark's Python workers (they call
            :func:`configure_logging` from it), a replay's processor, uvicorn's workers.
        record_level: Record the level too (``REFOLD_LOG_LEVEL``): for a processor, whose
            Spark workers log at its level. Not for a command whose own level is not its
            children's: ``replay`` is quiet (WARNING), the processor it starts logs INFO.

    Raises:
        ValueError: An unknown format (e.g. a misspelt ``REFOLD_LOG_FORMAT``).
    """
    if log_format not in _FORMATTERS:
        msg = f"unknown log format {log_format!r} ({LOG_FORMAT_ENV}?): plain or json"
        raise ValueError(msg)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FORMATTERS[cast("LogFormat", log_format)]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if environ is not None:
        environ[LOG_FORMAT_ENV] = log_format
        if record_level:
            environ[LOG_LEVEL_ENV] = level.upper()
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
