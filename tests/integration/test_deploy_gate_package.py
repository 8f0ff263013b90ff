"""The deploy gate sees all of a fold's code, not only its class's module (issue 44, item 1).

A user's fold as real folds are written: the class subclasses a base projection of the
package, its rule calls a pricing helper that reads a constants module, and it calls into a
library of another installed distribution, which the spec declares (``depends_on``) with an
explicit ``code_version``. Each of those used to keep the fingerprint: `replay check` said
"compatible ... resume it" while the fold's logic had changed. Now each change makes
`replay check` ask for a rebuild, and a processor refuses to resume the generation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refold.contracts.processors import process_argv
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry

PACKAGE, PROCESSOR = "spread_shop", "spread_sums"

CONFIG = """
from refold.contracts.processors import ProcessorSpec

SPREAD_SUMS = ProcessorSpec(
    name="spread_sums",
    projection="spread_shop.projection:build",
    topics=("commerce.orders",),
    key="order_id",
    tables=("orders",),
    aggregates=("spread_sums_totals",),
    depends_on=("spread-pricing",),
    code_version="{code_version}",
)
"""
FILES = {
    "__init__.py": "",
    "constants.py": "VAT_PERCENT = 20\n",
    "pricing.py": (
        "from spread_shop.constants import VAT_PERCENT\n\n\n"
        "def gross(net):\n    return net * (100 + VAT_PERCENT) // 100\n"
    ),
    "base.py": (
        "class BaseSums:\n"
        "    table = 'orders'\n"
        "    aggregate = 'spread_sums_totals'\n"
        "    event_types = ('OrderPaid',)\n\n"
        "    def key(self, event_type, event):\n"
        "        return str(event['order_id'])\n\n"
        "    def contribution(self, state):\n"
        "        return {'orders': 1, 'paid': state['paid']}\n"
    ),
    "projection.py": (
        "from spread_pricing import rounded\n\n"
        "from spread_shop.base import BaseSums\n"
        "from spread_shop.pricing import gross\n\n\n"
        "class SpreadSums(BaseSums):\n"
        "    name = 'spread_sums'\n\n"
        "    def apply(self, state, event_type, event):\n"
        "        paid = (state or {'paid': 0})['paid']\n"
        "        return {'paid': paid + rounded(gross(event['amount_minor']))}\n\n\n"
        "def build(options):\n    return SpreadSums()\n"
    ),
}
# (file, text) changes of what the fold depends on, and what the gate must name.
CHANGES = [
    ("base.py", FILES["base.py"].replace("'orders': 1", "'orders': 2")),
    ("pricing.py", FILES["pricing.py"].replace("// 100", "// 100 + 1")),
    ("constants.py", "VAT_PERCENT = 21\n"),
]


def _write(site: Path, code_version: str = "1", library_version: str = "1.0") -> None:
    package = site / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (package / name).write_text(text)
    (package / "config.py").write_text(CONFIG.format(code_version=code_version))
    dist = site / f"{PACKAGE}-0.1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[refold.processors]\n{PROCESSOR} = {PACKAGE}.config:SPREAD_SUMS\n"
    )
    # The second distribution: a library the fold calls into, at ``library_version``.
    (site / "spread_pricing.py").write_text("def rounded(n):\n    return int(n)\n")
    for old in site.glob("spread_pricing-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    library = site / f"spread_pricing-{library_version}.dist-info"
    library.mkdir()
    (library / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: spread-pricing\nVersion: {library_version}\n"
    )


@pytest.fixture
def gate(tmp_path, redis_url, kafka_bootstrap, unique):
    site = tmp_path / "site"
    _write(site)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "REFOLD_REDIS__URL": redis_url,
        "REFOLD_REDIS__KEY_PREFIX": f"spread-{unique}",
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
    }

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120
        )

    # g1, built by the first version: it records what that code prints as its fingerprints.
    printed = run(*process_argv([PROCESSOR], print_fingerprint=True)[1:])
    assert printed.returncode == 0, printed.stderr
    registry = GenerationRegistry.of(redis_client(redis_url), PROCESSOR, f"spread-{unique}")
    registry.create(json.loads(printed.stdout.splitlines()[-1]), live=True)
    return site, run


def _check(run) -> tuple[int, str]:
    done = run("-m", "refold.replay", "check", "--processor", PROCESSOR)
    return done.returncode, done.stdout + done.stderr


def test_a_change_in_any_module_or_declared_version_the_fold_depends_on_needs_a_rebuild(gate):
    site, run = gate
    code, out = _check(run)
    assert code == 0
    assert "compatible with g1" in out
    for name, text in CHANGES:
        (site / PACKAGE / name).write_text(text)
        code, out = _check(run)
        assert code == 5, f"{name}: {out}"
        assert "code_fingerprint" in out
        assert f"replay --processor {PROCESSOR} --to-earliest --execute" in out
        (site / PACKAGE / name).write_text(FILES[name])
    assert _check(run)[0] == 0  # back to the code g1 was built by
    for declared in ({"library_version": "1.1"}, {"code_version": "2"}):
        _write(site, **declared)
        code, out = _check(run)
        assert code == 5, f"{declared}: {out}"
        _write(site)
    assert _check(run)[0] == 0


def test_a_processor_refuses_to_resume_a_generation_built_before_its_helper_changed(gate):
    site, run = gate
    (site / PACKAGE / "pricing.py").write_text(CHANGES[1][1])
    done = run(*process_argv([PROCESSOR])[1:])
    assert done.returncode != 0
    assert "was built by other code (code fingerprint changed)" in done.stderr + done.stdout
