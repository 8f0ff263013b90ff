"""refold as a user gets it: the wheel built from this checkout, installed into a fresh venv.

One wheel per test session (:func:`session_wheel`); each venv is the test's own, so what it
can import is exactly what the wheel and the named extras install, never the checkout.

The wheel is built from a copy of the checkout: setuptools builds in the source tree (``build/``,
``refold.egg-info``), a directory that two test workers building at once would share, and
whose ``build/lib`` keeps modules deleted since an earlier build and ships them in the wheel.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# pip resolves the dependencies from the index (its cache, after the first time): ~20 s for
# the core, ~60 s more with pyspark's 400 MB wheel on this machine.
INSTALL_TIMEOUT_S = 600


# Not sources (.gitignore's list): build outputs, environments, caches, state; and git.
_NOT_SOURCES = frozenset(
    {"build", "target", "spark-warehouse", "metastore_db", "derby.log", "bench/results"}
)


def _not_sources(directory: str, names: list[str]) -> set[str]:
    """``shutil.copytree``'s ignore: what the checkout holds besides its sources."""
    skipped = {n for n in names if n == "__pycache__"}
    where = Path(directory).relative_to(ROOT)
    skipped |= {n for n in names if (where / n).as_posix() in _NOT_SOURCES}
    if where == Path():
        skipped |= {n for n in names if n.startswith(".") or n.endswith(".egg-info")}
    return skipped


@functools.cache
def session_wheel() -> Path:
    """Build the wheel of this checkout once per session (``pip wheel``, build isolation).

    From a copy of its sources, in a directory of this process (see the module's docstring).
    """
    work = Path(tempfile.mkdtemp(prefix="refold-wheel-"))
    # symlinks: refold/contracts -> ../contracts and its kin stay links into the copy.
    source = shutil.copytree(ROOT, work / "source", symlinks=True, ignore=_not_sources)
    out = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    shutil.rmtree(source)  # the wheel is all that is kept
    (built,) = out.glob("refold-*.whl")
    return built


def fresh_venv(path: Path, extras: tuple[str, ...] = (), *others: str) -> Path:
    """A new venv at ``path`` with the wheel (and ``extras``, and ``others``) installed.

    Returns:
        The venv's ``bin`` directory (its ``python``, ``pip``, ``refold``, ``replay``).
    """
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    wheel = session_wheel()
    requirement = f"refold[{','.join(extras)}] @ {wheel.as_uri()}" if extras else str(wheel)
    bin_dir = path / "bin"
    # --no-compile: pip would compile every installed module (pyspark's ~1,500) to bytecode,
    # ~10 CPU-s of 25 for the spark extra; the test's processes compile what they import.
    done = subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            requirement,
            *others,
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return bin_dir
