"""``refold``: the local stack, the demo, processors and replay behind one command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from deploy.local_stack import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    LocalStack,
    LocalStackError,
)

__all__ = ["main"]


def _stack(args: argparse.Namespace) -> LocalStack:
    return LocalStack(Path(args.state_dir) / "stack", args.kafka_port, args.redis_port)


def _cmd_up(args: argparse.Namespace) -> int:
    stack = _stack(args).start()
    print(
        f"local stack up: Kafka (Tansu, in-memory) at {stack.bootstrap_servers}, "
        f"Redis at {stack.redis_url}\nlogs and pid files in {stack.state_dir}\n"
        f"use it:  export REFOLD_KAFKA__BOOTSTRAP_SERVERS={stack.bootstrap_servers} "
        f"REFOLD_REDIS__URL={stack.redis_url}\nstop it: refold down"
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    running = [f"{s.name} (port {s.port})" for s in stack.status() if s.running]
    stack.stop()
    print(f"stopped: {', '.join(running)}" if running else "nothing was running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    any_running = False
    for server in stack.status():
        state = f"running (pid {server.pid})" if server.running else "stopped"
        any_running |= server.running
        print(f"{server.name:<6} port {server.port:<6} {state:<22} log {server.log_file}")
    return 0 if any_running else 3


def _cmd_demo(args: argparse.Namespace) -> int:
    from deploy.demo import run_demo

    return run_demo(orders=args.orders, state_dir=Path(args.state_dir))


def _cmd_process(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"processors.{args.name}.__main__")
    return int(module.main(args.rest))


def _cmd_replay(args: argparse.Namespace) -> int:
    from replay.__main__ import main as replay_main

    return replay_main(args.rest)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        msg = f"{text!r} is not a TCP port 1-65535"
        raise argparse.ArgumentTypeError(msg)
    return port


def _add_stack_options(parser: argparse.ArgumentParser, *, after_subcommand: bool) -> None:
    """Add ``--state-dir``, ``--kafka-port`` and ``--redis-port`` to ``parser``.

    The options are accepted before the subcommand (``parser`` is the top-level parser, defaults
    from the environment) and after it (``parser`` is a subcommand's, defaults suppressed, so a
    value given there overrides the one before the subcommand and an absent one leaves it alone).

    Args:
        parser: The top-level parser or the parser of ``up``, ``down`` or ``status``.
        after_subcommand: True for a subcommand's parser.
    """

    # A string default goes through ``type`` too, so a bad REFOLD_*_PORT is a usage error.
    def default(value: str) -> str:
        return argparse.SUPPRESS if after_subcommand else value

    parser.add_argument(
        "--state-dir",
        default=default(os.environ.get("REFOLD_STATE_DIR", ".state")),
        help="pid files, logs, checkpoints (env REFOLD_STATE_DIR, default .state)",
    )
    parser.add_argument(
        "--kafka-port",
        type=_port,
        default=default(os.environ.get("REFOLD_KAFKA_PORT", str(DEFAULT_KAFKA_PORT))),
        help="port of the local broker for `up` (env REFOLD_KAFKA_PORT, default "
        f"{DEFAULT_KAFKA_PORT}); `status` and `down` use the port recorded by `up`",
    )
    parser.add_argument(
        "--redis-port",
        type=_port,
        default=default(os.environ.get("REFOLD_REDIS_PORT", str(DEFAULT_REDIS_PORT))),
        help="port of the local redis-server for `up` (env REFOLD_REDIS_PORT, default "
        f"{DEFAULT_REDIS_PORT}); `status` and `down` use the port recorded by `up`",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line.

    Returns:
        The ``refold`` parser; the stack options may come before or after ``up|down|status``.
    """
    parser = argparse.ArgumentParser(
        prog="refold",
        description="refold: Kappa-style event sourcing (Avro contracts -> Kafka -> "
        "PySpark -> Redis).",
    )
    _add_stack_options(parser, after_subcommand=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("up", _cmd_up, "start the local stack (Tansu broker + redis-server)"),
        ("down", _cmd_down, "stop the local stack"),
        ("status", _cmd_status, "show the local stack (exit 3 when stopped)"),
    ):
        command = sub.add_parser(name, help=text)
        _add_stack_options(command, after_subcommand=True)
        command.set_defaults(func=func)
    demo = sub.add_parser("demo", help="run the end-to-end demo on a private local stack")
    demo.add_argument(
        "--orders",
        type=int,
        default=10_500,
        help="orders to simulate (~10 events each; default 10500)",
    )
    demo.set_defaults(func=_cmd_demo)
    process = sub.add_parser("process", help="run a processor (see `refold process NAME -h`)")
    process.add_argument("name", choices=["order_state"])
    process.add_argument("rest", nargs=argparse.REMAINDER)
    process.set_defaults(func=_cmd_process)
    replay = sub.add_parser(
        "replay", help="rebuild a processor's state (see `replay -h`)", add_help=False
    )
    replay.add_argument("rest", nargs=argparse.REMAINDER)
    replay.set_defaults(func=_cmd_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LocalStackError as exc:
        print(f"refold: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
