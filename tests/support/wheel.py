"""refold as a user gets it: the wheel built from this checkout, installed into a fresh venv.

One wheel per test session (:func:`session_wheel`); each venv is the test's own, so what it
can import is exactly what the wheel and the named extras install, never the checkout.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# pip resolves the dependencies from the index (its cache, after the first time): ~20 s for
# the core, ~60 s more with pyspark's 400 MB wheel on this machine.
INSTALL_TIMEOUT_S = 600


@functools.cache
def session_wheel() -> Path:
    """Build the wheel of this checkout once per session (``pip wheel``, build isolation)."""
    out = Path(tempfile.mkdtemp(prefix="refold-wheel-"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
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
    done = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", requirement, *others],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return bin_dir
