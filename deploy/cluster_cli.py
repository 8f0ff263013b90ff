"""``refold cluster up|down|status``: the command line of the local Spark standalone cluster.

The cluster itself (its daemons, pid files and logs) is
:class:`~refold.deploy.cluster.SparkCluster`; see ``docs/cluster.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from refold.deploy.cluster import (
    DEFAULT_MASTER_PORT,
    DEFAULT_WEBUI_PORT,
    DEFAULT_WORKER_CORES,
    DEFAULT_WORKER_MEMORY,
    DEFAULT_WORKER_WEBUI_PORT,
    ClusterError,
    ClusterSpec,
    SparkCluster,
)
from refold.deploy.processes import stop_hint, tcp_port

__all__ = ["add_cluster_commands"]

_MEMORY = re.compile(r"[1-9][0-9]*[mgtMGT]?")


def _cores(text: str) -> int:
    try:
        cores = int(text)
    except ValueError:
        cores = 0
    if cores < 1:
        msg = f"{text!r} is not a number of cores (1 or more)"
        raise argparse.ArgumentTypeError(msg)
    return cores


def _memory(text: str) -> str:
    if not _MEMORY.fullmatch(text):
        msg = f"{text!r} is not a Spark memory size such as 2g or 512m"
        raise argparse.ArgumentTypeError(msg)
    return text


def _cluster(args: argparse.Namespace) -> SparkCluster:
    spec = ClusterSpec(
        master_port=getattr(args, "master_port", DEFAULT_MASTER_PORT),
        webui_port=getattr(args, "webui_port", DEFAULT_WEBUI_PORT),
        worker_webui_port=getattr(args, "worker_webui_port", DEFAULT_WORKER_WEBUI_PORT),
        worker_cores=getattr(args, "worker_cores", DEFAULT_WORKER_CORES),
        worker_memory=getattr(args, "worker_memory", DEFAULT_WORKER_MEMORY),
    )
    return SparkCluster(Path(args.state_dir) / "cluster", spec)


def _cmd_up(args: argparse.Namespace) -> int:
    cluster = _cluster(args).start()
    spec = cluster.spec
    down = stop_hint("refold cluster down", args.state_dir)
    print(
        f"Spark standalone cluster up: master {spec.master_url} (web UI {spec.webui_url}), "
        f"one worker with {spec.worker_cores} cores and {spec.worker_memory}\n"
        f"logs and pid files in {cluster.state_dir}\n"
        f"use it:  export REFOLD_SPARK__MASTER={spec.master_url} REFOLD_SPARK__CORES_MAX=1\n"
        f"stop it: {down}"
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    stopped = _cluster(args).stop()
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    daemons = cluster.status()
    for daemon in daemons:
        state = f"running (pid {daemon.pid})" if daemon.running else "stopped"
        if daemon.role == "master" and daemon.port is not None:
            where = f"spark://{cluster.spec.host}:{daemon.port} ui :{daemon.webui_port}"
        else:
            where = f"ui :{daemon.webui_port}" if daemon.webui_port else ""
        print(f"{daemon.role:<7} {where:<36} {state:<22} log {daemon.log_file}")
    master = cluster.master_state()
    if master is not None:
        apps = [
            f"{app.get('name')} ({app.get('cores')} cores)" for app in master.get("activeapps", [])
        ]
        print(
            f"workers alive: {master.get('aliveworkers', 0)}, cores {master.get('coresused', 0)}"
            f"/{master.get('cores', 0)} used, applications: {', '.join(apps) or 'none'}"
        )
    return 0 if any(daemon.running for daemon in daemons) else 3


def _run(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ClusterError as exc:
            print(f"refold: {exc}", file=sys.stderr)
            return 1

    return run


def add_cluster_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    env: Mapping[str, str] | None = None,
) -> None:
    """Add ``cluster up|down|status`` to the ``refold`` parser's subcommands.

    Each command's function is ``args.func`` and returns the exit code (1 on a
    :class:`ClusterError`, printed; ``status`` 3 when nothing runs). ``--state-dir`` is the
    top-level parser's option, also accepted after the subcommand.

    Args:
        sub: The top-level parser's subparsers.
        env: Defaults of the options (``REFOLD_CLUSTER_*``); default ``os.environ``.
    """
    env = os.environ if env is None else env
    cluster = sub.add_parser("cluster", help="a local Spark standalone cluster (master + worker)")
    commands = cluster.add_subparsers(dest="cluster_command", required=True)
    for name, func, text in (
        ("up", _cmd_up, "start a Spark master and one worker on loopback"),
        ("down", _cmd_down, "stop them (and their executors)"),
        ("status", _cmd_status, "show them (exit 3 when stopped)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument(
            "--state-dir",
            default=argparse.SUPPRESS,
            help="pid files and logs go to STATE_DIR/cluster (env REFOLD_STATE_DIR, "
            "default .state)",
        )
        command.set_defaults(func=_run(func))
        if name != "up":
            continue
        for option, kind, default, meaning in (
            ("--master-port", tcp_port, DEFAULT_MASTER_PORT, "master port"),
            ("--webui-port", tcp_port, DEFAULT_WEBUI_PORT, "master web UI port"),
            ("--worker-webui-port", tcp_port, DEFAULT_WORKER_WEBUI_PORT, "worker web UI port"),
            ("--worker-cores", _cores, DEFAULT_WORKER_CORES, "worker cores"),
            ("--worker-memory", _memory, DEFAULT_WORKER_MEMORY, "worker memory"),
        ):
            variable = "REFOLD_CLUSTER_" + option.removeprefix("--").replace("-", "_").upper()
            # A string default goes through ``type`` too: a bad REFOLD_CLUSTER_* is a usage error.
            command.add_argument(
                option,
                type=kind,
                default=env.get(variable, str(default)),
                help=f"{meaning} (env {variable}, default {default})",
            )
