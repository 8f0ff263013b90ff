"""refold as a user installs it: one top-level package, ``refold``, from a wheel or editable.

The folders the design fixes (``contracts/ services/ processors/ replay/ deploy/``) install as
``refold.contracts`` and so on; a user's own ``services`` or ``contracts`` package must never be
shadowed by refold's.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("contracts", "services", "processors", "replay", "deploy")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("refold-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"refold"}
    for folder in FOLDERS:
        assert f"refold/{folder}/__init__.py" in names
    assert "refold/py.typed" in names  # user code type-checks against refold's hints
    assert "refold/contracts/schemas/commerce/OrderPlaced.v1.avsc" in names
    assert "refold/contracts/schemas/commerce/contracts.lock" in names
    assert any(name.startswith("refold/services/dashboard/static/") for name in names)


def test_every_entry_point_of_the_wheel_names_a_refold_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = (n for n in archive.namelist() if n.endswith("entry_points.txt"))
        lines = archive.read(entry_points).decode().splitlines()
    targets = [line.split("=", 1)[1].strip() for line in lines if "=" in line]
    assert targets  # the two commands, the contracts and the processors
    assert [t for t in targets if not t.startswith("refold.")] == []


def test_outside_the_checkout_only_refold_is_importable(tmp_path: Path) -> None:
    # The editable install of this checkout, from a directory that is not the checkout.
    probe = (
        "import importlib.util as u, sys; import refold.contracts.settings, refold.replay.plan; "
        f"print([n for n in {FOLDERS!r} if u.find_spec(n) is not None])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
