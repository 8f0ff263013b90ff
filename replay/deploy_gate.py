"""Does this deployment need a replay? Compare the deployed code with the live generation.

The processor prints the fingerprints its code would record (``--print-fingerprint``), so
replay learns them without importing processor internals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import redis

from refold.contracts.processors import ProcessorSpec, process_argv
from refold.contracts.store.generations import GenerationRegistry
from refold.replay.errors import ReplayError

__all__ = ["GateVerdict", "check_deploy", "deployed_fingerprints"]

_FIELDS = ("code_fingerprint", "schema_fingerprints")


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """The gate's answer for one processor."""

    processor: str
    live_generation: int | None
    compatible: bool
    changed: tuple[str, ...]
    deployed: dict[str, str]
    recorded: dict[str, str]

    def render(self) -> str:
        """For people: the verdict and what to run."""
        if self.live_generation is None:
            return f"{self.processor}: no live generation yet; the first run creates one"
        if self.compatible:
            return (
                f"{self.processor}: compatible with g{self.live_generation} "
                "(same code and reader schemas): resume it"
            )
        lines = [
            f"{self.processor}: g{self.live_generation} was built by other code; needs a rebuild"
        ]
        for name in self.changed:
            lines.append(
                f"  {name}: live {self.recorded.get(name, '-')} -> deployed {self.deployed[name]}"
            )
        lines.append(f"  run: replay --processor {self.processor} --to-earliest --execute")
        return "\n".join(lines)


def deployed_fingerprints(spec: ProcessorSpec, python: str = sys.executable) -> dict[str, str]:
    """Ask the deployed processor code for its fingerprints (in a process of its own).

    Raises:
        ReplayError: The processor command could not be run.
    """
    command = process_argv([spec.name], print_fingerprint=True, python=python)
    done = subprocess.run(  # noqa: S603 - our interpreter and module
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        msg = f"`{' '.join(command[1:])}` failed: {done.stderr.strip()[-500:]}"
        raise ReplayError(msg)
    fingerprints = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: str(v) for k, v in fingerprints.items() if k in _FIELDS}


def check_deploy(
    spec: ProcessorSpec, client: redis.Redis, key_prefix: str, deployed: dict[str, str]
) -> GateVerdict:
    """Compare deployed fingerprints with the live generation's."""
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    live = registry.live()
    recorded = registry.meta(live) if live is not None else {}
    changed = tuple(n for n in _FIELDS if live is not None and recorded.get(n) != deployed.get(n))
    return GateVerdict(
        spec.name,
        live,
        not changed,
        changed,
        deployed,
        {n: recorded[n] for n in _FIELDS if n in recorded},
    )
