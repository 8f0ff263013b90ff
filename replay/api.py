"""Replay's HTTP control routes, mounted by ``refold serve`` (``deploy/serve_cli.py``).

- ``POST /v1/processors/{name}/replays:plan``: the dry run, as ``replay plan --json`` prints it.
- ``POST /v1/processors/{name}/replays``: plan, and when the plan passes its checks start the
  rebuild as its own process (``replay plan ... --execute``, the same command an operator
  runs), answering 202 at once; its progress is ``GET /v1/replays``, its log the returned path.
- ``POST /v1/processors/{name}/rollback`` and ``POST /v1/processors/{name}/gc``.

The routes here carry no authentication of their own: the composition root mounts
:func:`plan_router` behind the query scope and :func:`admin_router` behind the admin scope
(replay does not import the services).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import redis
from fastapi import APIRouter, Path as PathParam, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.registry import processor_spec
from refold.contracts.settings import StackSettings
from refold.contracts.store.connect import redis_client
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.replay.as_of import parse_until
from refold.replay.generations_admin import collect_garbage, rollback
from refold.replay.rebuild import plan_replay
from refold.replay.reset_specs import (
    ByDuration,
    FromOffset,
    ResetSpec,
    ShiftBy,
    ToCurrent,
    ToDatetime,
    ToEarliest,
    ToLatest,
    parse_datetime,
    parse_duration,
    parse_scope,
)

__all__ = ["PlanRequest", "admin_router", "plan_router"]

_NAME = r"^[a-z][a-z0-9_]*$"
# The dry run reads at most this many records' writer schemas by default (the CLI's default is
# 1M: an HTTP request should answer in seconds).
_API_SCAN_LIMIT = 100_000
_MAX_SCAN_LIMIT = 1_000_000  # the CLI's default: a request never reads more of the log

Target = Literal["earliest", "latest", "current", "offset", "shift", "datetime", "duration"]


class PlanRequest(BaseModel):
    """Where the new generation starts (the flags of ``replay plan``)."""

    model_config = ConfigDict(extra="forbid")

    to: Target = Field(
        description="earliest | latest | current | offset | shift | datetime | duration"
    )
    offset: int | None = Field(default=None, ge=0, description="to=offset: this offset everywhere")
    shift_by: int | None = Field(default=None, description="to=shift: move positions by N")
    datetime: str | None = Field(default=None, description="to=datetime: ISO-8601 with a zone")
    duration: str | None = Field(default=None, description="to=duration: e.g. PT1H (now minus)")
    topics: list[str] | None = Field(default=None, description="TOPIC or TOPIC:P,P (scope)")
    until: str | None = Field(
        default=None,
        description="state as of this moment (ISO-8601 with a zone): the generation stops there "
        "and is kept beside the live one, without a flip",
    )
    until_offsets: str | None = Field(
        default=None,
        description='as until, at offsets: {"topic":{"0":42}} or topic,partition,offset lines',
    )
    allow_data_loss: bool = False
    accept_dead_letters: bool = False
    scan_limit: int = Field(default=_API_SCAN_LIMIT, ge=0, le=_MAX_SCAN_LIMIT)

    @model_validator(mode="after")
    def _argument(self) -> PlanRequest:
        needs = {"offset": self.offset, "shift": self.shift_by, "datetime": self.datetime}
        needs["duration"] = self.duration
        if self.to in needs and needs[self.to] is None:
            field = {"shift": "shift_by"}.get(self.to, self.to)
            msg = f"to={self.to} needs the field {field!r}"
            raise ValueError(msg)
        if self.until and self.until_offsets:
            msg = "until and until_offsets name one moment: give one of them"
            raise ValueError(msg)
        return self

    def reset_spec(self) -> ResetSpec:
        """The plan's reset spec (PlanError, a 422, for an unreadable time or duration)."""
        if self.to == "offset":
            return FromOffset(int(self.offset or 0))
        if self.to == "shift":
            return ShiftBy(int(self.shift_by or 0))
        if self.to == "datetime":
            return ToDatetime(parse_datetime(str(self.datetime)))
        if self.to == "duration":
            return ByDuration(parse_duration(str(self.duration)), datetime.now(UTC))
        if self.to == "latest":
            return ToLatest()
        if self.to == "current":
            return ToCurrent()
        return ToEarliest()

    def flags(self) -> list[str]:
        """The same plan as ``replay plan`` flags."""
        flags = {
            "earliest": ["--to-earliest"],
            "latest": ["--to-latest"],
            "current": ["--to-current"],
            "offset": ["--from-offset", str(self.offset)],
            "shift": [f"--shift-by={self.shift_by}"],
            "datetime": ["--to-datetime", str(self.datetime)],
            "duration": ["--by-duration", str(self.duration)],
        }[self.to]
        for topic in self.topics or []:
            flags += ["--topic", topic]
        if self.until:
            flags += ["--until", self.until]
        if self.until_offsets:
            flags += ["--until-offsets", self.until_offsets]
        if self.allow_data_loss:
            flags.append("--allow-data-loss")
        if self.accept_dead_letters:
            flags.append("--accept-dead-letters")
        return [*flags, "--scan-limit", str(self.scan_limit)]


@dataclass
class _Control:
    settings: StackSettings
    client: redis.Redis

    def plan(self, name: str, request: PlanRequest) -> dict[str, Any]:
        spec = processor_spec(name)
        plan = plan_replay(
            spec,
            request.reset_spec(),
            self.settings.kafka,
            self.client,
            self.settings.redis.key_prefix,
            parse_scope(request.topics),
            allow_data_loss=request.allow_data_loss,
            scan_limit=request.scan_limit,
            accept_dead_letters=request.accept_dead_letters,
            archive_root=self.settings.cold_tier(),
            until=parse_until(request.until, request.until_offsets),
        )
        return plan.as_dict()

    def start(self, name: str, request: PlanRequest) -> tuple[int, Path]:
        """Start ``replay plan --execute`` as its own process; its pid and log file."""
        logs = self.settings.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"replay-{name}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        settings = self.settings
        env = ProcessLauncher(
            settings.kafka,
            settings.redis,
            settings.spark,
            settings.state_dir,
            schema_registry=settings.schema_registry,
        ).env()
        argv = [sys.executable, "-m", "refold.replay", "plan"]
        argv += ["--processor", name, *request.flags(), "--execute", "--no-progress"]
        process = GroupProcess(argv, env, log).start()
        # Reap it when it ends (its outcome is in its log and in Redis), leaving no zombie.
        threading.Thread(target=process.wait, name=f"replay-{name}", daemon=True).start()
        return process.pid, log


def _control(settings: StackSettings) -> _Control:
    return _Control(settings, redis_client(settings.redis.client_url()))


Name = Annotated[str, PathParam(pattern=_NAME)]


def plan_router(settings: StackSettings) -> APIRouter:
    """The dry run (read-only: mount it behind the query scope)."""
    control = _control(settings)
    router = APIRouter(tags=["control"])

    @router.post("/v1/processors/{name}/replays:plan")
    def plan_replay_route(name: Name, request: PlanRequest) -> dict[str, Any]:
        """Plan a rebuild into a new generation (dry run: nothing changes)."""
        return control.plan(name, request)

    return router


def admin_router(settings: StackSettings) -> APIRouter:
    """Execute, rollback and gc (mount them behind the admin scope)."""
    control = _control(settings)
    router = APIRouter(tags=["control"])

    @router.post("/v1/processors/{name}/replays", status_code=202)
    def execute_replay(name: Name, request: PlanRequest) -> JSONResponse:
        """Plan, then start the rebuild in the background (202); 409 if the plan fails."""
        plan = control.plan(name, request)
        if not plan["ready"]:
            failed = [c for c in plan["checks"] if not c["ok"]]
            return JSONResponse(
                {
                    "error": {
                        "code": "PLAN_NOT_READY",
                        "message": "the plan fails its checks: "
                        + "; ".join(f"{c['name']}: {c['detail']}" for c in failed),
                        "plan": plan,
                    }
                },
                status_code=409,
            )
        pid, log = control.start(name, request)
        return JSONResponse(
            {
                "processor": name,
                "pid": pid,
                "log": str(log),
                "plan": plan,
                "progress": "/v1/replays",
            },
            status_code=202,
        )

    @router.post("/v1/processors/{name}/rollback")
    def rollback_route(name: Name) -> dict[str, Any]:
        """Flip readers back to the generation the live one replaced."""
        now, before = rollback(processor_spec(name), control.client, settings.redis.key_prefix)
        return {"processor": name, "live_generation": now, "retired": before}

    @router.post("/v1/processors/{name}/gc")
    def gc_route(
        name: Name,
        execute: Annotated[
            bool, Query(description="really remove them (default: dry run)")
        ] = False,
    ) -> dict[str, Any]:
        """Remove retired generations (their keys and checkpoints); a dry run by default."""
        removed = collect_garbage(
            processor_spec(name),
            control.client,
            settings.redis.key_prefix,
            checkpoint_root(
                settings.state_dir, settings.spark, key_prefix=settings.redis.key_prefix
            ),
            execute=execute,
            spark=settings.spark,
        )
        return {
            "processor": name,
            "executed": execute,
            "generations": [{"generation": g, "keys": k} for g, k in removed],
        }

    return router
