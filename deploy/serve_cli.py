"""``refold serve``: the HTTP services (ingest, query, control, metrics, dashboard) on uvicorn.

Settings: the stack's ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``, ``REFOLD_STATE_DIR`` and the
service's ``REFOLD_SERVE__*`` (e.g. ``REFOLD_SERVE__PORT``); options override them. This module
is the only one that reads the environment, and the composition root of the app: it mounts
replay's control routes behind the query and admin scopes (services do not import replay).
"""

from __future__ import annotations

import argparse
import os
import sys

import redis
from fastapi import APIRouter, Depends, FastAPI
from pydantic import ValidationError

from refold.contracts.cli_parser import CommandParser
from refold.contracts.logconfig import (
    LOG_FORMAT_ENV,
    LOG_LEVEL_ENV,
    add_log_format_argument,
    configure_logging,
)
from refold.contracts.settings import RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.credentials import RedisCredentialsError, redis_refused
from refold.replay.api import admin_router, plan_router
from refold.services.api.app import create_app
from refold.services.api.config import ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.auth import require

__all__ = ["build_app", "build_parser", "main"]

_EXAMPLES = """examples:
  refold keys add --name ops --scope admin          # a key (shown once)
  refold serve                                      # http://127.0.0.1:8000/docs, /dashboard
  refold serve --host 0.0.0.0 --port 8080 --workers 2
  refold serve --access-log                         # a line per request (no proxy logs them)
  REFOLD_SERVE__AUTH=off refold serve               # development only: no keys
"""


def build_app(settings: ServeSettings, context: ServiceContext | None = None) -> FastAPI:
    """The whole app: the services' routes and replay's control routes, with their scopes.

    Args:
        settings: Its settings.
        context: Shared clients (default: made from ``settings``).
    """
    planning = APIRouter(dependencies=[Depends(require("query"))])
    planning.include_router(plan_router(settings))
    admin = APIRouter(dependencies=[Depends(require("admin"))])
    admin.include_router(admin_router(settings))
    return create_app(settings, context=context, routers=[planning, admin])


def app_from_env() -> FastAPI:
    """Uvicorn's factory (each worker process builds its app from the environment)."""
    # The format and level main() chose, recorded in the environment the workers inherit.
    configure_logging(
        os.environ.get(LOG_LEVEL_ENV, "INFO"), log_format=os.environ.get(LOG_FORMAT_ENV, "plain")
    )
    return build_app(ServeSettings())


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = CommandParser(
        prog="refold serve",
        description="Serve ingest, query, control, /metrics, /health and the dashboard over "
        "HTTP. OpenAPI at /docs. TLS: terminate it at a load balancer or reverse proxy, or "
        "give --ssl-certfile and --ssl-keyfile (docs/serving.md).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="interface to bind (env REFOLD_SERVE__HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (env REFOLD_SERVE__PORT, default 8000)")
    parser.add_argument("--workers", type=int, help="worker processes (REFOLD_SERVE__WORKERS, 1)")
    parser.add_argument(
        "--auth", choices=["keys", "off"], help="API keys (default) or none (development only)"
    )
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", help="and this private key")
    parser.add_argument("--log-level", default="info", help="log level (refold's and uvicorn's)")
    add_log_format_argument(parser, os.environ)
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="uvicorn's access log, a line per request at level info (default off: it cost "
        "~20%% of a single-key read's CPU; the proxy or load balancer in front logs requests)",
    )
    return parser


def _redis_login_refused(settings: RedisSettings) -> RedisCredentialsError | None:
    """Redis refusing the services' login, found before they start.

    An outage is no reason not to start: the routes answer 503 until Redis is back.
    """
    client = redis_client(settings.client_url(), socket_connect_timeout=2)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return redis_refused("the HTTP services", client, exc)
    except redis.RedisError:
        return None
    finally:
        client.close()
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    for option in ("host", "port", "workers", "auth", "ssl_certfile", "ssl_keyfile"):
        value = getattr(args, option)
        if value is not None:  # the workers read their settings from the environment
            os.environ[f"REFOLD_SERVE__{option.upper()}"] = str(value)
    try:
        settings = ServeSettings()
    except ValidationError as exc:
        print(f"refold serve: invalid settings: {exc}", file=sys.stderr)
        return 2
    serve = settings.serve
    refused = _redis_login_refused(settings.redis)
    if refused is not None:
        print(f"refold serve: {refused}", file=sys.stderr)
        return 2
    import uvicorn

    # One handler for refold's and uvicorn's lines (its error and access logs): uvicorn gets
    # no logging config of its own (log_config=None), so its loggers propagate to this one.
    configure_logging(args.log_level, log_format=args.log_format, environ=os.environ)
    print(
        f"refold serve: http://{serve.host}:{serve.port}/docs (API), /dashboard, /metrics; "
        f"auth {serve.auth}",
        file=sys.stderr,
    )
    uvicorn.run(
        "refold.deploy.serve_cli:app_from_env",
        factory=True,
        host=serve.host,
        port=serve.port,
        workers=serve.workers,
        log_level=args.log_level,
        log_config=None,
        access_log=args.access_log,
        ssl_certfile=None if serve.ssl_certfile is None else str(serve.ssl_certfile),
        ssl_keyfile=None if serve.ssl_keyfile is None else str(serve.ssl_keyfile),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
