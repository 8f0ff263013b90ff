"""Fingerprints recorded with each generation: which code and which schemas built it."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import types
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from refold.contracts.catalog import SchemaCatalog

__all__ = [
    "NOTHING_DECLARED",
    "DeclaredCode",
    "code_fingerprint",
    "fold_modules",
    "schema_fingerprints",
]


@dataclass(frozen=True, slots=True)
class DeclaredCode:
    """What a hash of the fold's modules cannot see, as the processor declares it.

    Attributes:
        version: An explicit version of the fold (``ProcessorSpec.code_version``): bump it for
            what changes the state without changing a module of the package (a data file, a
            model, a configuration read at import). "" declares none.
        distributions: Installed distributions whose version is part of the code identity
            (``ProcessorSpec.depends_on``): a library the fold calls into.
        factory_module: The module of the spec's ``projection`` factory. Its package is the
            fold's package, and the module counts even when the fold's class is a library's
            (a pattern or window fold configured there). "": the fold class's module.
    """

    version: str = ""
    distributions: tuple[str, ...] = ()
    factory_module: str = ""

    def marker(self) -> str:
        """The declaration with the versions installed now ("" when nothing is declared)."""
        parts = [f"code_version={self.version}"] if self.version else []
        for name in sorted(self.distributions):
            try:
                installed = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                installed = "not-installed"
            parts.append(f"{name}=={installed}")
        return ";".join(parts)


NOTHING_DECLARED = DeclaredCode()


class _WhatFolds(ast.NodeTransformer):
    """Drops what cannot change a fold's result: import lines and docstrings."""

    def visit_Import(self, node: ast.Import) -> None:
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return node


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A module's source as a process loaded it: its normalised tree and what it imports."""

    normalised: str
    imports: tuple[str, ...]


def _imported(tree: ast.Module, package: str) -> Iterator[str]:
    """Every name an import of ``tree`` may load as a module, relative ones resolved.

    ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a submodule or an attribute:
    :func:`fold_modules` keeps only the names that are modules). Imports inside functions
    count: a helper imported lazily still runs in the fold.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                with contextlib.suppress(ImportError, ValueError):  # beyond the top package
                    base = importlib.util.resolve_name("." * node.level + base, package)
            if base:
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)


def _read(module: types.ModuleType) -> _Loaded:
    try:
        source = inspect.getsource(module)
    except OSError:  # an empty file (an empty __init__.py) has no source lines to find
        source = ""
    package = module.__package__ or module.__name__.rpartition(".")[0]
    tree = ast.parse(source)
    imports = tuple(sorted(set(_imported(tree, package))))
    normalised = ast.dump(_WhatFolds().visit(tree), annotate_fields=False)
    return _Loaded(normalised, imports)


# What each module, class or function's module held, read the first time this process
# fingerprints it. Keyed by the object itself (weakly): a reloaded module's new classes and
# functions are read again, the ones this process runs keep the source they were loaded from.
_LOADED: weakref.WeakKeyDictionary[object, _Loaded] = weakref.WeakKeyDictionary()


def _as_loaded(part: object) -> _Loaded:
    """``part``'s module (its source and imports), as it was when first fingerprinted here.

    ``inspect.getsource`` reads the file on disk *now* (linecache re-reads a changed file), so
    a process fingerprinting its code again after the file was edited would get the new code's
    fingerprint while running the old code: the one way a generation could be written by code
    it was not built with (a running processor following a cutover to a rebuild of new code).
    Reading once, as early as possible (refold fingerprints a processor right after importing
    it), pins the fingerprint to the code the process runs.
    """
    with contextlib.suppress(KeyError, TypeError):  # TypeError: takes no weak reference
        return _LOADED[part]
    target = part if inspect.ismodule(part) else inspect.getmodule(part) or part
    loaded = _read(target)  # type: ignore[arg-type]
    with contextlib.suppress(TypeError):
        _LOADED[part] = loaded
    return loaded


def _scope(module_name: str) -> str:
    """The package whose modules count as the fold's code: the fold module's top package.

    A user's fold is spread over their package (a base projection, a pricing helper, a
    constants module). refold's own reference processors are the exception: their package is
    the library, which is versioned as a whole (declare ``depends_on=("refold",)`` to rebuild
    on its upgrades); their own folder counts.
    """
    parts = module_name.split(".")
    return ".".join(parts[:3]) if parts[0] == "refold" else parts[0]


def _module(name: str) -> types.ModuleType | None:
    """The module ``name`` names, imported if it was not yet; None: not a module."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except (ImportError, ValueError):  # an attribute of a module, or a module that cannot load
        return None


def fold_modules(fold: type, factory_module: str = "") -> list[types.ModuleType]:
    """The modules of the fold's package that it depends on, other than ``fold``'s own.

    The package is that of ``factory_module`` (where the spec builds the fold), else that of
    ``fold``'s module (:func:`_scope`). Starting from the factory's module and the modules of
    ``fold`` and its base classes that are in the package, modules are followed through their
    imports (at any depth, lazy ones inside functions included). Only modules of the package
    count: other distributions are covered by their declared versions (:class:`DeclaredCode`).
    """
    scope = _scope(factory_module or fold.__module__)

    def inside(name: str) -> bool:
        return name == scope or name.startswith(scope + ".")

    found: dict[str, types.ModuleType] = {}
    pending = [c.__module__ for c in fold.__mro__ if inside(c.__module__)]
    pending += [factory_module] if factory_module else []
    while pending:
        name = pending.pop()
        if name in found:
            continue
        module = _module(name)
        if module is None:
            continue
        found[name] = module
        # The fold's own module as loaded with the fold (the class pins what it was read as).
        loaded = _as_loaded(fold if name == fold.__module__ else module)
        pending += [n for n in loaded.imports if inside(n)]
    found.pop(fold.__module__, None)  # hashed as the fold itself
    return [found[name] for name in sorted(found)]


def code_fingerprint(*parts: object) -> str:
    """SHA-256 (first 16 hex digits) of what code does, and of version markers.

    Modules count with their source, classes and functions with their module's source, plain
    strings as they are. Sources are hashed as syntax trees without import lines, docstrings,
    comments and formatting: moving an import or a module (refactoring) keeps the fingerprint,
    changing a statement or a constant changes it.

    A process fingerprints the code it loaded: each object's source is read from disk the
    first time it is fingerprinted here, never again (see :func:`_as_loaded`).
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(part.encode())
            continue
        digest.update(_as_loaded(part).normalised.encode())
    return digest.hexdigest()[:16]


def schema_fingerprints(catalog: SchemaCatalog, event_types: Iterable[str]) -> dict[str, str]:
    """Reader schema fingerprint (hex) per event type."""
    return {name: catalog.latest(name).fingerprint_hex for name in sorted(event_types)}
