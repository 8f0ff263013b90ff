"""Plug-in discovery from a package of a user's own, installed as a wheel would install it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from refold.contracts.errors import ContractError
from refold.contracts.processors import ProcessorSpec
from refold.contracts.registry import ContractSet, Registry, UnknownProcessorError
from refold.contracts.topics import TopicSpec


def _install(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """Write a package and its dist-info into ``site`` (what pip does for a wheel)."""
    for relative, source in modules.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    info.joinpath("entry_points.txt").write_text(textwrap.dedent(entry_points))


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield site
    for module in [m for m in sys.modules if m.startswith("shop_plugin")]:
        del sys.modules[module]


def test_processors_and_contracts_of_an_installed_package_are_discovered(site):
    _install(
        site,
        "shop_plugin",
        """
        [refold.processors]
        basket_stats = shop_plugin.spec:BASKET_STATS
        [refold.contracts]
        baskets = shop_plugin.spec:contracts
        """,
        {
            "shop_plugin/__init__.py": "",
            "shop_plugin/schemas/.keep": "",
            "shop_plugin/spec.py": """
                from pathlib import Path
                from refold.contracts.processors import ProcessorSpec
                from refold.contracts.registry import ContractSet
                from refold.contracts.topics import TopicSpec

                BASKETS = TopicSpec("shop.baskets", 4, "basket_id", ("BasketChanged",))
                BASKET_STATS = ProcessorSpec(
                    name="basket_stats",
                    projection="shop_plugin.fold:build",
                    topics=(BASKETS.name,),
                    key="basket_id",
                    tables=("baskets",),
                )

                def contracts():  # a callable is called
                    return ContractSet("baskets", Path(__file__).parent / "schemas", (BASKETS,))
            """,
        },
    )
    registry = Registry.from_entry_points()
    spec = registry.processor("basket_stats")
    assert spec.package == "shop_plugin 1.0"
    assert spec.key == "basket_id"
    assert "order_state" in registry.processors  # refold's own, registered the same way
    assert registry.topic("shop.baskets").key_field == "basket_id"
    assert registry.contract_sets["baskets"].package == "shop_plugin 1.0"
    assert site / "shop_plugin" / "schemas" in registry.schema_dirs()


def test_a_broken_plugin_is_named(site):
    _install(
        site,
        "shop_plugin",
        "[refold.processors]\nbroken = shop_plugin.missing:SPEC\n",
        {"shop_plugin/__init__.py": ""},
    )
    with pytest.raises(ContractError, match=r"refold.processors:broken = shop_plugin.missing"):
        Registry.from_entry_points()


def test_unknown_processors_name_the_known_ones():
    registry = Registry([_spec("a"), _spec("b")], [])
    with pytest.raises(UnknownProcessorError, match=r"known: a, b"):
        registry.processor("c")


def test_a_processor_or_topic_registered_twice_is_refused(tmp_path):
    with pytest.raises(ContractError, match="registered twice"):
        Registry([_spec("a"), _spec("a")], [])
    topic = TopicSpec("t", 1, "k", ("E",))
    with pytest.raises(ContractError, match="declared twice"):
        Registry([], [ContractSet("x", tmp_path, (topic,)), ContractSet("y", tmp_path, (topic,))])


def test_specs_are_checked():
    with pytest.raises(ContractError, match="lower case"):
        _spec("Bad-Name")
    with pytest.raises(ContractError, match="module:attribute"):
        ProcessorSpec("ok", "no_colon", ("t",), "k", ())


def _spec(name: str) -> ProcessorSpec:
    return ProcessorSpec(name, "m:f", ("t",), "k", ("tbl",))
