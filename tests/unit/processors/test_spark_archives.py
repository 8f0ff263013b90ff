"""Spark's archives off the path of the Python processes a refold driver's JVM starts.

Each case starts a real interpreter the way Spark starts its planners and workers: Spark's
archives first on ``PYTHONPATH``, then what the driver's environment had (here, refold's
startup directory first, as ``build_spark_session`` sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from refold.processors.runtime.spark_archives import WORKER_STARTUP, with_worker_startup

_SPARK_LIB = Path(pyspark.__file__).parent / "python" / "lib"
_PROBE = (
    "import json, sys, pyspark; "
    "print(json.dumps({'pyspark': pyspark.__file__, 'path': sys.path, "
    "'hidden': getattr(sys, 'hidden_sitecustomize_ran', False)}))"
)


def _spark_archives() -> list[str]:
    return sorted(str(p) for p in _SPARK_LIB.glob("*.zip"))


def _started_by_spark(python_path: str) -> dict[str, object]:
    """What an interpreter sees when Spark starts it with its archives before ``python_path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*_spark_archives(), python_path])}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    # site.py reports a failing sitecustomize on stderr and goes on: none may fail here.
    assert "sitecustomize" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def test_the_archives_exist_where_spark_puts_them() -> None:
    # The premise: the pip wheel ships pyspark.zip (sources only) and py4j's zip.
    assert any(name.endswith("pyspark.zip") for name in _spark_archives())


def test_without_the_startup_directory_pyspark_comes_from_the_zip() -> None:
    seen = _started_by_spark("")
    assert "pyspark.zip" in str(seen["pyspark"])


def test_with_it_pyspark_comes_from_the_installed_package_and_the_archives_are_gone() -> None:
    seen = _started_by_spark(with_worker_startup(""))
    assert Path(str(seen["pyspark"])) == Path(pyspark.__file__)
    assert not [p for p in seen["path"] if str(_SPARK_LIB) in p]  # type: ignore[union-attr]


def test_the_environments_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.hidden_sitecustomize_ran = True\n")
    seen = _started_by_spark(with_worker_startup(str(tmp_path)))
    assert seen["hidden"] is True
    assert Path(str(seen["pyspark"])) == Path(pyspark.__file__)


def test_the_startup_directory_twice_under_another_name_runs_once(tmp_path: Path) -> None:
    # A symlink to it later on the path is the same directory: not a hidden sitecustomize.
    alias = tmp_path / "alias"
    alias.symlink_to(WORKER_STARTUP, target_is_directory=True)
    seen = _started_by_spark(with_worker_startup(str(alias)))
    assert Path(str(seen["pyspark"])) == Path(pyspark.__file__)


def test_the_startup_directory_is_put_first_once_and_holds_nothing_else() -> None:
    twice = with_worker_startup(with_worker_startup(f"/a{os.pathsep}/b"))
    assert twice.split(os.pathsep) == [str(WORKER_STARTUP), "/a", "/b"]
    assert sorted(p.name for p in WORKER_STARTUP.iterdir() if p.suffix == ".py") == [
        "sitecustomize.py"
    ]
