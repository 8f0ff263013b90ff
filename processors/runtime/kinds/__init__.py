"""The kinds of state a fold writes, one module each, and the registry that picks one.

See :mod:`.base` for what a kind implements. The built-in kinds register here, in this order,
so that a lookup or a window fold is recognised before the entity kind, which accepts any fold.
"""

from __future__ import annotations

from refold.processors.runtime.kinds.base import (
    BatchKind,
    FoldContext,
    KindDiff,
    StagedBatch,
    kind_diffs,
    kind_of,
    register_kind,
)
from refold.processors.runtime.kinds.entity import EntityKind
from refold.processors.runtime.kinds.lookups import LookupKind, is_lookup_fold
from refold.processors.runtime.kinds.windows import WindowKind, is_window_fold

__all__ = [
    "BatchKind",
    "FoldContext",
    "KindDiff",
    "StagedBatch",
    "kind_diffs",
    "kind_of",
    "register_kind",
]

register_kind("entity", lambda _projection: True, EntityKind)
register_kind("windows", is_window_fold, WindowKind)
register_kind("lookups", is_lookup_fold, LookupKind)
