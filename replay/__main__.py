"""``replay``: rebuild a processor's state from the log into a new generation, online.

Dry run by default: prints the per-partition plan. ``--execute`` builds the new generation while
the live one keeps serving readers, waits until it has caught up, then flips readers to it.
"""

from __future__ import annotations

import os
import sys

import redis

from refold.contracts.errors import RefoldError
from refold.contracts.logconfig import configure_logging
from refold.contracts.store.connect import redis_client, unreachable
from refold.contracts.store.credentials import redis_refused
from refold.replay.admin_commands import (
    cmd_check,
    cmd_diff,
    cmd_gc,
    cmd_rollback,
    cmd_snapshot,
    cmd_status,
)
from refold.replay.arguments import build_parser, parse_args
from refold.replay.config import ReplaySettings
from refold.replay.errors import ReplayInterruptedError
from refold.replay.plan_command import cmd_plan

__all__ = ["build_parser", "main", "parse_args"]

_HANDLERS = {
    "plan": cmd_plan,
    "status": cmd_status,
    "rollback": cmd_rollback,
    "gc": cmd_gc,
    "diff": cmd_diff,
    "check": cmd_check,
    "snapshot": cmd_snapshot,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code.

    0 ok, 1 error, 4 ``diff`` found differences, 5 ``check``: a rebuild is needed, 143 / 130
    a rebuild interrupted by SIGTERM / SIGINT (its processor stopped, readers left where they
    were).
    """
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging(args.log_level, log_format=args.log_format, environ=os.environ)
    settings = ReplaySettings()
    try:
        client = redis_client(settings.redis.client_url())
        return _HANDLERS[args.command](args, settings, client)
    except ReplayInterruptedError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return exc.exit_code
    except redis.AuthenticationError as exc:
        print(f"replay: {redis_refused('replay', client, exc)}", file=sys.stderr)
        return 1
    except redis.ConnectionError as exc:
        print(f"replay: {unreachable(exc)}", file=sys.stderr)
        return 1
    except (RefoldError, redis.RedisError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
