"""How a Python process of Spark's driver ends when the driver stopped before it connected.

Spark's driver starts Python processes of its own (a Python data source's planners, its
streaming reader: ``python -m pyspark.sql.streaming.python_streaming_source_runner``), and each
connects back over a Unix socket whose path it is given. A processor stopped within its first
seconds can remove that socket before the process connects. PySpark then raises
``CANNOT_OPEN_SOCKET`` ("No such file or directory"), and Python prints the traceback into the
processor's log, at a stop that went as it should: the driver no longer waits for the process.

The same stop can also come while the process works: the driver closes its socket (a query
stopping), and the process, reading its next call, gets ``ConnectionResetError`` (or EOF), then
fails again writing the error back (``BrokenPipeError``): a two-part traceback, once in a few
hundred processor stops.

refold's ``sitecustomize`` (``worker_startup/``) installs :func:`excepthook` in those
processes. For these two cases it prints a line instead of the traceback; the exit code stays
Python's (1). Any other exception goes to the hook that was there before. Kept free of imports
beyond the standard library: every Python process the driver starts imports it.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

__all__ = ["driver_closed", "driver_stopped_first", "excepthook", "install"]

_SOCKET_PATH = "PYTHON_WORKER_FACTORY_SOCK_PATH"  # set by Spark over Unix sockets


def driver_stopped_first(error: BaseException) -> bool:
    """Whether ``error`` is PySpark's failure to reach a driver socket that no longer exists."""
    path = os.environ.get(_SOCKET_PATH)
    if not path or type(error).__name__ != "PySparkRuntimeError":
        return False
    condition = getattr(error, "getCondition", None)
    return callable(condition) and condition() == "CANNOT_OPEN_SOCKET" and not os.path.exists(path)


def driver_closed(error: BaseException) -> bool:
    """Whether ``error`` is the driver having closed this process's socket while it worked."""
    return _SOCKET_PATH in os.environ and isinstance(error, BrokenPipeError | ConnectionResetError)


def excepthook(
    kind: type[BaseException], error: BaseException, trace: TracebackType | None
) -> None:
    """One line where the driver stopped first (see the module); otherwise the previous hook."""
    program = " ".join(sys.orig_argv[1:3]) or sys.argv[0]
    if driver_stopped_first(error):
        print(
            f"refold: {program} ended without work: Spark's driver had stopped and removed "
            f"its socket ({os.environ[_SOCKET_PATH]}) before this process connected",
            file=sys.stderr,
        )
        return
    if driver_closed(error):
        print(
            f"refold: {program} ended: Spark's driver closed its socket "
            f"({os.environ[_SOCKET_PATH]}) while this process worked (its query stopped)",
            file=sys.stderr,
        )
        return
    _previous(kind, error, trace)


_previous = sys.excepthook


def install() -> None:
    """Make :func:`excepthook` this process's hook, in front of the one it had."""
    global _previous
    if sys.excepthook is not excepthook:
        _previous = sys.excepthook
        sys.excepthook = excepthook
