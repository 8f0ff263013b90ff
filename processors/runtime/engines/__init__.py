"""The engines a processor runs on, one module each, and the registry that picks one.

See :mod:`.base` for the questions an engine answers and the order in which engines are asked:
those added with :func:`register_engine` first, then the built-in ones (:mod:`.archive`,
:mod:`.dataframe`, and the fold engines of :mod:`.fold`), loaded on first use.
"""

from __future__ import annotations

from refold.processors.runtime.engines.base import (
    Engine,
    QueryStart,
    RunningSink,
    SinkTotal,
    built_in_engines,
    engine_of,
    register_engine,
)

__all__ = [
    "Engine",
    "QueryStart",
    "RunningSink",
    "SinkTotal",
    "built_in_engines",
    "engine_of",
    "register_engine",
]
