"""refold's optional parts (pip extras), and the error that names the one to install.

``pip install refold`` alone publishes events and reads state: contracts, codec, the producer
SDK, the readers, the HTTP client, webhooks. Processors, replay and the archive need
``refold[spark]``; the HTTP services need ``refold[serve]``; ``refold[local]`` is both, plus
what the demo reads the archive with. :data:`EXTRAS` says which importable modules each extra
brings; ``tests/unit/contracts/test_extras.py`` checks it against ``pyproject.toml``.

Entry points that need an extra run their imports under :func:`needs_extra`, so a missing one
is one line that says what to install, not a traceback ending in ``No module named 'pyspark'``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from refold.contracts.errors import RefoldError

__all__ = ["EXTRAS", "MissingExtraError", "extra_of", "needs_extra"]

# extra -> the top-level modules it installs (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "pandas"),
    "serve": ("fastapi", "uvicorn", "prometheus_client", "limits"),
    "local": (
        *("pyspark", "pyarrow", "pandas"),
        *("fastapi", "uvicorn", "prometheus_client", "limits"),
        "duckdb",
    ),
}


class MissingExtraError(RefoldError, ImportError):
    """A feature's optional dependencies are not installed; the message names the extra."""

    code: ClassVar[str] = "MISSING_EXTRA"


def extra_of(module: str) -> str | None:
    """The smallest extra that installs ``module`` (a dotted name), or None if none does."""
    top = module.partition(".")[0]
    for extra, modules in sorted(EXTRAS.items(), key=lambda item: len(item[1])):
        if top in modules:
            return extra
    return None


@contextmanager
def needs_extra(feature: str, extra: str | None = None) -> Iterator[None]:
    """Turn a missing optional module, imported inside the block, into a one-line error.

    Args:
        feature: What the user asked for, for the message (``"refold serve"``).
        extra: The extra the feature needs as a whole; default the one that installs the
            missing module.

    Raises:
        MissingExtraError: An import in the block failed for a module an extra installs. Other
            import errors pass unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        installs = extra_of(exc.name or "")
        if installs is None:
            raise
        extra = extra or installs
        msg = (
            f"{feature} needs refold's {extra!r} extra ({exc.name} is not installed). "
            f"Operator action: pip install 'refold[{extra}]'"
        )
        raise MissingExtraError(msg, name=exc.name) from exc
