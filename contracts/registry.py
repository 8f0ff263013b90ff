"""Plug-ins: the processors and contracts that installed packages declare through entry points.

A package (refold itself, or a user's own) declares in its ``pyproject.toml``::

    [project.entry-points."refold.contracts"]
    shop = "shop_events.contracts:CONTRACTS"        # a ContractSet

    [project.entry-points."refold.processors"]
    customer_stats = "shop_events.processors:CUSTOMER_STATS"   # a ProcessorSpec

Loading an entry point imports only the module that holds the spec (keep it light: no Spark,
no clients). Everything else (the schema catalog, topic specs, the CLI, replay, services) asks
this module, so adding a processor or a contract never means editing refold.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, TypeVar

from refold.contracts.errors import ContractError
from refold.contracts.processors import ProcessorSpec
from refold.contracts.schema_registry import SINGLE_OBJECT, Framing
from refold.contracts.topics import TopicSpec

__all__ = [
    "CONTRACTS_GROUP",
    "PROCESSORS_GROUP",
    "ContractSet",
    "Registry",
    "UnknownProcessorError",
    "default_registry",
    "import_reference",
    "processor_spec",
    "with_fallback",
]

CONTRACTS_GROUP = "refold.contracts"
PROCESSORS_GROUP = "refold.processors"
_T = TypeVar("_T")


class UnknownProcessorError(ContractError):
    """No installed package registers a processor of that name."""

    code = "PROCESSOR_UNKNOWN"


@dataclass(frozen=True, slots=True)
class ContractSet:
    """The contracts of one domain: a folder of Avro schemas and the topics that carry them.

    Attributes:
        name: Domain name (``commerce``).
        schemas: Folder of ``<Record>.v<N>.avsc`` files, one version per file, never deleted.
            Its ``contracts.lock`` lists the fingerprints of the published versions.
        topics: The topics whose events are these records.
        package: The distribution that registered it (filled in by the registry).
        framing: How producers write the records of its topics that do not say
            (:attr:`TopicSpec.framing`): ``single-object`` (the default, no server) or
            ``registry`` (docs/schema-registry.md); :meth:`Registry.framing` resolves a
            topic's.
    """

    name: str
    schemas: Path
    topics: tuple[TopicSpec, ...] = ()
    package: str = field(default="", compare=False)
    framing: Framing = SINGLE_OBJECT

    @property
    def lock_path(self) -> Path:
        """The lock of published fingerprints, beside the schemas."""
        return self.schemas / "contracts.lock"


def import_reference(reference: str) -> Any:
    """Import ``module:attribute`` (dots allowed in the attribute).

    Raises:
        ContractError: It does not import, naming the reference.
    """
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split(".") if attribute else ():
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        msg = f"cannot import {reference!r}: {exc}"
        raise ContractError(msg) from exc
    return target


def _load(point: EntryPoint, kind: type[_T]) -> _T:
    try:
        value = point.load()
    except Exception as exc:  # a broken plug-in is named, not a traceback from importlib
        msg = f"entry point {point.group}:{point.name} = {point.value} does not load: {exc!r}"
        raise ContractError(msg) from exc
    if callable(value) and not isinstance(value, kind):
        value = value()
    if not isinstance(value, kind):
        msg = (
            f"entry point {point.group}:{point.name} = {point.value} is a "
            f"{type(value).__name__}, not a {kind.__name__}"
        )
        raise ContractError(msg)
    return value


def _package(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return "" if dist is None else f"{dist.name} {dist.version}"


class Registry:
    """The processors and contract sets of the installed packages (or of explicit lists).

    Args:
        processors: Processor specs.
        contract_sets: Contract sets.

    Raises:
        ContractError: Two specs share a name, or two sets declare one topic.
    """

    def __init__(
        self, processors: Iterable[ProcessorSpec], contract_sets: Iterable[ContractSet]
    ) -> None:
        self.processors: dict[str, ProcessorSpec] = {}
        for spec in processors:
            clash = self.processors.get(spec.name)
            if clash is not None:
                msg = (
                    f"processor {spec.name!r} is registered twice ({clash.package}, {spec.package})"
                )
                raise ContractError(msg)
            self.processors[spec.name] = spec
        self.contract_sets: dict[str, ContractSet] = {}
        self.topics: dict[str, TopicSpec] = {}
        self.framings: dict[str, Framing] = {}
        for contract_set in contract_sets:
            self.contract_sets[contract_set.name] = contract_set
            for topic in contract_set.topics:
                if topic.name in self.topics:
                    msg = f"topic {topic.name} is declared twice (in {contract_set.name})"
                    raise ContractError(msg)
                self.topics[topic.name] = topic
                # A topic's framing: its own, else its contract set's (one place says it).
                self.framings[topic.name] = topic.framing or contract_set.framing

    @classmethod
    def from_entry_points(cls) -> Registry:
        """Everything the installed packages register."""
        processors = [
            replace(_load(p, ProcessorSpec), package=_package(p))
            for p in sorted(entry_points(group=PROCESSORS_GROUP), key=lambda p: p.name)
        ]
        for point, spec in zip(
            sorted(entry_points(group=PROCESSORS_GROUP), key=lambda p: p.name),
            processors,
            strict=True,
        ):
            if spec.name != point.name:
                msg = f"entry point {point.name!r} registers a processor named {spec.name!r}"
                raise ContractError(msg)
        sets = [
            replace(_load(p, ContractSet), package=_package(p))
            for p in sorted(entry_points(group=CONTRACTS_GROUP), key=lambda p: p.name)
        ]
        return cls(processors, sets)

    def processor(self, name: str) -> ProcessorSpec:
        """A processor by name.

        Raises:
            UnknownProcessorError: With the known names and how to register one.
        """
        try:
            return self.processors[name]
        except KeyError:
            known = ", ".join(sorted(self.processors)) or "none"
            msg = (
                f"unknown processor {name!r}; known: {known}. Operator action: install the "
                f"package that registers it (entry point group {PROCESSORS_GROUP!r})."
            )
            raise UnknownProcessorError(msg) from None

    def topic(self, name: str) -> TopicSpec:
        """A topic's spec.

        Raises:
            ContractError: No contract set declares it.
        """
        try:
            return self.topics[name]
        except KeyError:
            known = ", ".join(sorted(self.topics)) or "none"
            msg = f"no contract set declares topic {name!r}; known: {known}"
            raise ContractError(msg) from None

    def framing(self, topic: str) -> Framing:
        """How producers write ``topic``'s records (single-object for a topic no set declares)."""
        return self.framings.get(topic, SINGLE_OBJECT)

    def schema_dirs(self) -> list[Path]:
        """Every contract set's schema folder."""
        return [s.schemas for s in self.contract_sets.values()]


def processor_spec(name: str) -> ProcessorSpec:
    """A registered processor by name (:class:`UnknownProcessorError` naming the known ones)."""
    return default_registry().processor(name)


@cache
def default_registry() -> Registry:
    """The registry of the installed packages, loaded once per process."""
    return Registry.from_entry_points()


def with_fallback(getter: Callable[[], _T], fallback: _T) -> _T:
    """``getter()``, or ``fallback`` when the registry cannot be loaded (for help texts)."""
    try:
        return getter()
    except ContractError:
        return fallback
