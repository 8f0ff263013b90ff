"""Which code may write a generation: the fingerprints it records and the checks on every path.

A generation records the fingerprints of the code that built it (``code_fingerprint``,
``schema_fingerprints``). It is only ever written by code with those fingerprints (DESIGN.md
decision 5), on each path a process can take to it:

- a cold start or a restart: :func:`check_resume` (the deploy gate; ``--accept-code-change``
  records the new fingerprints instead of refusing);
- a running processor that follows the live alias after a cutover: :func:`check_follow`. It
  never accepts a change by itself: a process started with ``--accept-code-change`` accepted
  the generation it started on, not the one a later rebuild of other code made. It records its
  refusal in the generation's meta (``code_refused``), so status, the monitor and the
  dashboard say who is waiting for which code;
- an executor (a Spark Python worker) that imported the processor's module after the file was
  edited under the running process: :func:`check_executor_code`, before the task writes.

Fingerprints are those of the code the process loaded (:mod:`refold.contracts.fingerprints` reads
each source once): the driver fingerprints a processor right after importing it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from refold.contracts.catalog import default_catalog
from refold.contracts.fingerprints import (
    NOTHING_DECLARED,
    DeclaredCode,
    code_fingerprint,
    fold_modules,
    schema_fingerprints,
)
from refold.contracts.layout import STATE_LAYOUT_VERSION
from refold.contracts.store.generations import CODE_REFUSED_FIELD, GenerationRegistry
from refold.processors.errors import CodeChangedError
from refold.processors.fold.projection import Projection

__all__ = [
    "build_fingerprints",
    "changed_fingerprints",
    "check_executor_code",
    "check_follow",
    "check_resume",
]

logger = logging.getLogger(__name__)


def build_fingerprints(
    projection: Projection, declared: DeclaredCode = NOTHING_DECLARED
) -> dict[str, str]:
    """What a generation records about the code that builds it (the deploy gate compares it).

    The code fingerprint covers the projection's module and every module of its package that
    it depends on (:func:`~refold.contracts.fingerprints.fold_modules`), the fold contract,
    the state layout version and what the processor declares (its ``code_version`` and the
    installed versions of its ``depends_on`` distributions); the schema fingerprints are the
    reader schemas of its event types. A fold in one module that declares nothing keeps the
    fingerprint it had before the other modules counted.

    Args:
        projection: The fold, as this process loaded it.
        declared: What the processor's spec declares about its code.
    """
    from refold.processors.fold import projection as fold_contract

    fold = type(projection)
    marker = declared.marker()
    return {
        "code_fingerprint": code_fingerprint(
            fold,
            *fold_modules(fold, declared.factory_module),
            fold_contract,
            f"layout-v{STATE_LAYOUT_VERSION}",
            *([marker] if marker else []),
        ),
        "schema_fingerprints": json.dumps(
            schema_fingerprints(default_catalog(), projection.event_types), sort_keys=True
        ),
    }


def changed_fingerprints(stored: dict[str, str], current: dict[str, str]) -> list[str]:
    """The fingerprint names whose stored value differs (a name not stored yet is no change)."""
    return [name for name, value in current.items() if stored.get(name, value) != value]


def _what(changed: list[str]) -> str:
    return " and ".join(n.replace("_", " ") for n in changed)


def check_resume(
    registry: GenerationRegistry,
    projection: Projection,
    generation: int,
    accept: bool,
    declared: DeclaredCode = NOTHING_DECLARED,
) -> None:
    """Refuse to resume a generation built by other code, unless told to accept the change.

    Raises:
        CodeChangedError: The fingerprints differ and ``accept`` is false.
    """
    stored = registry.meta(generation)
    current = build_fingerprints(projection, declared)
    changed = changed_fingerprints(stored, current)
    if changed and not accept:
        msg = (
            f"{projection.name} g{generation} was built by other code ({_what(changed)} "
            "changed). Its state may not match what this code would fold. Operator action: "
            f"rebuild with `replay --processor {projection.name} --to-earliest --execute` "
            f"(readers keep g{generation} meanwhile), or pass --accept-code-change if the "
            "change does not affect the state."
        )
        raise CodeChangedError(msg)
    if changed:
        logger.warning("g%d: accepting changed %s", generation, ", ".join(changed))
    # Record them on a generation created without (e.g. by replay) or accepted; whoever runs
    # it now has its code, so an earlier refusal is over.
    fields = current if changed else {k: v for k, v in current.items() if k not in stored}
    registry.update_meta(generation, fields)
    if CODE_REFUSED_FIELD in stored:
        registry.client.hdel(registry.keys(generation).meta, CODE_REFUSED_FIELD)


def check_follow(
    registry: GenerationRegistry,
    projection: Projection,
    retired: int,
    live: int,
    declared: DeclaredCode = NOTHING_DECLARED,
) -> None:
    """Before a running processor continues the new live generation after a cutover.

    Raises:
        CodeChangedError: The live generation was built by other code than this process runs.
            The process must stop (the caller does) and leave the generation to a process with
            its code; the refusal is recorded in the generation's meta.
    """
    current = build_fingerprints(projection, declared)
    changed = changed_fingerprints(registry.meta(live), current)
    if not changed:
        return
    refusal = {
        "code_fingerprint": current["code_fingerprint"],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "at": int(time.time() * 1000),
        "from_generation": retired,
    }
    registry.update_meta(live, {CODE_REFUSED_FIELD: json.dumps(refusal, sort_keys=True)})
    msg = (
        f"{projection.name} g{retired} was retired and readers now see g{live}, which was "
        f"built by other code ({_what(changed)} changed; this process runs code "
        f"{current['code_fingerprint']}). This process stops instead of folding g{live} with "
        f"the old code; g{live} waits, its lag growing, until a processor with its code runs "
        f"it. Operator action: start `refold process {projection.name}` with the code g{live} "
        "was built by (the new version), or `replay rollback` to flip readers back."
    )
    raise CodeChangedError(msg)


# Per Python worker: the processors whose loaded code was checked against the driver's.
_CHECKED: set[tuple[str, str]] = set()


def check_executor_code(
    projection: Projection, expected: str, declared: DeclaredCode = NOTHING_DECLARED
) -> None:
    """On an executor, before a task writes: is this worker's code the driver's code?

    Executor side (a Spark Python worker). A worker imports the processor's module when it
    unpickles its first task, from the file as it is then; a worker started after the file was
    edited under a running processor would fold with other code than the generation's.
    Checked once per worker and processor (the fingerprint is memoised with the loaded code).

    Args:
        projection: The fold, as this worker unpickled it.
        expected: The driver's code fingerprint ("" skips the check).
        declared: What the processor's spec declares about its code (the driver's).

    Raises:
        CodeChangedError: The worker's code differs; the task fails before writing anything.
    """
    if not expected or (projection.name, expected) in _CHECKED:
        return
    found = build_fingerprints(projection, declared)["code_fingerprint"]
    if found != expected:
        msg = (
            f"{projection.name}: the code of this processor changed on disk under the running "
            f"process (the driver runs {expected}, a new Spark worker loaded {found}); "
            "nothing was written with it. Operator action: restart the processor (the deploy "
            "gate then decides whether its generation needs a rebuild)."
        )
        raise CodeChangedError(msg)
    _CHECKED.add((projection.name, expected))
