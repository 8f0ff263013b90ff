"""The engines a processor runs on, one module each, and the registry that picks one.

See :mod:`.base` for the questions an engine answers. The built-in engines register here, in
this order, so that the archive, a DataFrame processor, a window fold and a lookup fold are
recognised before the fold engine, which accepts any projection. The lookup engine is asked
before the window engine, as the lookup kind is before the window kind
(:mod:`refold.processors.runtime.kinds`).
"""

from __future__ import annotations

from refold.processors.runtime.engines.archive import ArchiveEngine
from refold.processors.runtime.engines.base import (
    Engine,
    QueryStart,
    RunningSink,
    SinkTotal,
    engine_of,
    register_engine,
)
from refold.processors.runtime.engines.dataframe import DataFrameEngine
from refold.processors.runtime.engines.fold import FoldEngine, LookupFoldEngine, WindowFoldEngine

__all__ = [
    "Engine",
    "QueryStart",
    "RunningSink",
    "SinkTotal",
    "engine_of",
    "register_engine",
]

register_engine(FoldEngine())
register_engine(WindowFoldEngine())
register_engine(LookupFoldEngine())
register_engine(DataFrameEngine())
register_engine(ArchiveEngine())
