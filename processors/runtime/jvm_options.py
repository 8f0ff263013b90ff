"""The driver JVM's options with a path in them, as ``spark.driver.extraJavaOptions`` holds them.

Spark's launcher splits that string into the JVM's arguments the way a shell splits words
(quotes and backslashes, ``CommandBuilderUtils.parseOptionString``): a path with a space in it,
written bare, became two arguments and the JVM did not start (PySpark's ``JAVA_GATEWAY_EXITED``,
nothing more). So a path is quoted as a shell would need it, and left as it is when it needs
no quoting.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["path_option"]


def path_option(option: str, path: Path | str) -> str:
    """``option`` followed by ``path``, one JVM argument however the path is spelled.

    ``path_option("-Djava.io.tmpdir=", "/tmp/a b")`` is ``-Djava.io.tmpdir='/tmp/a b'``.
    """
    return f"{option}{shlex.quote(str(path))}"
