"""``refold webhooks run | log | redrive``: deliver critical insights to a webhook.

``run`` delivers the records of insight topics to a URL (HTTP POST of JSON, at least once, each
with an ``Idempotency-Key``) until stopped (SIGTERM/SIGINT: requests in flight finish, the
delivered prefix is committed), or with ``--once`` until it has caught up. ``log`` prints a
dispatcher's counters, positions and newest delivery-log entries. ``redrive`` delivers the
dispatcher's dead-letter topic again (up to its end at start). See docs/webhooks.md.

Settings: ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*`` (the stack) and ``REFOLD_WEBHOOKS__<FIELD>``
defaults for the dispatcher (e.g. ``REFOLD_WEBHOOKS__URL``, ``REFOLD_WEBHOOKS__TOPICS=a,b``,
``REFOLD_WEBHOOKS__SIGNING_SECRET``, ``REFOLD_WEBHOOKS__HEADERS='{"Authorization": "..."}'``:
keep secrets there, not on the command line); options override them. This module is the only
one that reads the environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import redis
from pydantic import ValidationError

from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import RefoldError
from refold.contracts.logconfig import add_log_format_argument, configure_logging
from refold.contracts.store.connect import redis_client
from refold.services.webhooks.config import DEFAULT_NAME, WebhookServiceSettings, WebhookSettings
from refold.services.webhooks.dispatcher import Role, WebhookDispatcher
from refold.services.webhooks.store import LogEntry, WebhookStore, list_dispatchers

__all__ = ["build_parser", "main"]

_EXAMPLES = """examples:
  refold webhooks run --topic order_alerts.insights --url https://ops.example.com/hooks
  refold webhooks run --name pager --topic a.insights --topic b.insights --url ... --once
  refold webhooks log --name pager -n 50 --status failed
  refold webhooks redrive --name pager --url https://ops.example.com/hooks
"""


def _add_delivery_options(command: argparse.ArgumentParser, *, topics: bool) -> None:
    command.add_argument(
        "--name",
        help=f"dispatcher name: its Redis keys and its dead-letter topic <name>.webhook-dlq "
        f"(default {DEFAULT_NAME})",
    )
    command.add_argument("--url", help="receiver URL (env REFOLD_WEBHOOKS__URL)")
    if topics:
        command.add_argument(
            "--topic",
            dest="topics",
            action="append",
            metavar="TOPIC",
            help="insight topic to deliver, repeatable (env REFOLD_WEBHOOKS__TOPICS=a,b)",
        )
        command.add_argument(
            "--start",
            choices=("earliest", "end"),
            help="where a topic with no stored position starts (default earliest)",
        )
        command.add_argument(
            "--severity",
            dest="severities",
            action="append",
            metavar="SEVERITY",
            help="deliver records of this severity, repeatable (default critical; 'any': all; "
            "records without a severity field are always delivered)",
        )
        command.add_argument(
            "--once",
            action="store_true",
            help="stop once everything on the topics when it started is delivered",
        )
    for flag, field, kind, text in (
        ("--concurrency", "concurrency", int, "requests in flight (default 8)"),
        ("--batch-size", "batch_size", int, "records per poll and commit (default 200)"),
        (
            "--max-uncommitted",
            "max_uncommitted",
            int,
            "records in progress at most: what a crash re-delivers at most (default 1000)",
        ),
        ("--max-attempts", "max_attempts", int, "attempts before the DLQ (default 12)"),
        ("--backoff-initial", "backoff_initial_s", float, "first backoff, s (default 0.5)"),
        ("--backoff-max", "backoff_max_s", float, "backoff cap, s (default 120)"),
        ("--timeout", "timeout_s", float, "request timeout, s (default 10)"),
        ("--connect-timeout", "connect_timeout_s", float, "connect timeout, s (default 3)"),
    ):
        metavar = "N" if kind is int else "SECONDS"
        command.add_argument(flag, dest=field, type=kind, metavar=metavar, help=text)
    command.add_argument(
        "--header",
        dest="header_list",
        action="append",
        metavar="'NAME: VALUE'",
        help="extra request header, repeatable (visible in the process list: put secrets in "
        "REFOLD_WEBHOOKS__HEADERS instead)",
    )
    command.add_argument(
        "--ca-bundle", metavar="PEM", help="CA certificates to verify the receiver with"
    )
    command.add_argument("--client-cert", metavar="PEM", help="client certificate (mutual TLS)")
    command.add_argument("--client-key", metavar="PEM", help="its key, if not in --client-cert")
    command.add_argument("--log-level", default="INFO")
    add_log_format_argument(command, os.environ)


def build_parser() -> argparse.ArgumentParser:
    """The ``refold webhooks`` command line."""
    parser = CommandParser(
        prog="refold webhooks",
        description="Deliver critical insights to a webhook: HTTP POST of JSON, at least once, "
        "with an Idempotency-Key per insight, retries with backoff, a dead-letter topic and a "
        "delivery log in Redis.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="deliver insight topics to a URL until stopped (or --once)",
        description="Deliver insight topics to a URL; SIGTERM/SIGINT stop it cleanly.",
    )
    _add_delivery_options(run, topics=True)
    redrive = sub.add_parser(
        "redrive",
        help="deliver the dead-letter topic <name>.webhook-dlq again, up to its end",
        description="Deliver every dead letter of a dispatcher again, with its original "
        "Idempotency-Key; what fails again goes back to the dead-letter topic.",
    )
    _add_delivery_options(redrive, topics=False)
    log = sub.add_parser(
        "log", help="a dispatcher's counters, positions and newest delivery-log entries"
    )
    log.add_argument("--name", default=DEFAULT_NAME, help=f"dispatcher (default {DEFAULT_NAME})")
    log.add_argument("-n", "--count", type=int, default=20, help="entries (default 20)")
    log.add_argument(
        "--status", choices=("delivered", "retry", "failed"), help="only entries of this status"
    )
    log.add_argument("--json", action="store_true", help="as JSON")
    return parser


def _env_defaults(env: WebhookServiceSettings) -> dict[str, Any]:
    """``REFOLD_WEBHOOKS__*`` as fields (lists and maps given as JSON or, topics, a,b)."""
    given = dict(env.webhooks)
    topics = given.get("topics")
    if isinstance(topics, str):
        text = topics.strip()
        given["topics"] = json.loads(text) if text.startswith("[") else text.split(",")
    severities = given.get("severities")
    if isinstance(severities, str):
        text = severities.strip()
        given["severities"] = json.loads(text) if text.startswith("[") else text.split(",")
    headers = given.get("headers")
    if isinstance(headers, str):
        given["headers"] = json.loads(headers)
    return given


def _settings(args: argparse.Namespace, env: WebhookServiceSettings, role: Role) -> WebhookSettings:
    fields = _env_defaults(env)
    for name in WebhookSettings.model_fields:
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if fields.get("severities") and "any" in fields["severities"]:
        fields["severities"] = []
    if role == "dispatch" and not fields.get("topics"):
        msg = "no topic: give --topic (repeatable) or REFOLD_WEBHOOKS__TOPICS"
        raise _UsageError(msg)
    if not fields.get("url"):
        msg = "no URL: give --url or REFOLD_WEBHOOKS__URL"
        raise _UsageError(msg)
    for line in args.header_list or []:
        header, sep, value = line.partition(":")
        if not sep:
            msg = f"--header {line!r}: expected 'NAME: VALUE'"
            raise _UsageError(msg)
        fields.setdefault("headers", {})[header.strip()] = value.strip()
    try:
        return WebhookSettings.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        msg = f"invalid settings: {problems}"
        raise _UsageError(msg) from exc


class _UsageError(Exception):
    """A command-line or environment mistake (exit 2)."""


def _client(env: WebhookServiceSettings) -> redis.Redis:
    return redis_client(env.redis.client_url())


def _run(args: argparse.Namespace, env: WebhookServiceSettings, role: Role) -> int:
    settings = _settings(args, env, role)
    dispatcher = WebhookDispatcher(
        settings,
        env.kafka.as_librdkafka(),
        _client(env),
        env.redis.key_prefix,
        role=role,
        until_end=bool(getattr(args, "once", False)),
    )

    def _stop(signum: int, _frame: FrameType | None) -> None:
        print(f"{signal.Signals(signum).name}: stopping after the requests in flight", flush=True)
        dispatcher.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    started = time.monotonic()
    dispatcher.run()
    stats = dispatcher.stats
    print(
        f"{settings.name} ({role}): delivered {stats.delivered}, retried {stats.retried}, "
        f"dead-lettered {stats.failed} to {settings.dlq_topic} "
        f"in {time.monotonic() - started:.1f}s",
        flush=True,
    )
    return 0


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _log(args: argparse.Namespace, env: WebhookServiceSettings) -> int:
    from refold.contracts.service_keys import WebhookKeys

    client = _client(env)
    prefix = env.redis.key_prefix
    store = WebhookStore(client, WebhookKeys(args.name, prefix), 100)
    counters = store.counters()
    if not counters and not store.log_length():
        known = list_dispatchers(client, prefix)
        names = ", ".join(known) if known else "none yet"
        print(f"no deliveries recorded for dispatcher {args.name!r}; dispatchers: {names}")
        return 0
    entries: list[LogEntry] = []
    for entry in store.recent(max(args.count, 1) * (10 if args.status else 1)):
        if args.status is None or entry.status == args.status:
            entries.append(entry)
        if len(entries) >= args.count:
            break
    positions = store.positions()
    if args.json:
        document = {
            "name": args.name,
            "counters": counters,
            "positions": {f"{t}/{p}": o for (t, p), o in sorted(positions.items())},
            "entries": [_as_dict(e) for e in entries],
        }
        print(json.dumps(document, indent=2))
        return 0
    print(f"dispatcher {args.name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())))
    print("positions: " + ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(positions.items())))
    for e in entries:
        error = f"  {e.error}" if e.error else ""
        print(
            f"{_when(e.time_ms)}  {e.status:<9} {e.code or '-':>3}  attempt {e.attempts:<2} "
            f"{e.latency_ms:7.1f} ms  {e.topic}/{e.partition}@{e.offset}  {e.id}"
            f"{'  ' + e.reason if e.reason else ''}{error}"
        )
    return 0


def _as_dict(entry: LogEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in LogEntry.__dataclass_fields__}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    configure_logging(
        getattr(args, "log_level", "WARNING"),
        log_format=getattr(args, "log_format", "plain"),
        environ=os.environ,
    )
    for chatty in ("httpx", "httpcore"):  # one line per request otherwise
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        env = WebhookServiceSettings()
        if args.command == "log":
            return _log(args, env)
        return _run(args, env, "redrive" if args.command == "redrive" else "dispatch")
    except _UsageError as exc:
        print(f"refold webhooks {args.command}: {exc}", file=sys.stderr)
        return 2
    except (RefoldError, redis.RedisError) as exc:
        print(f"refold webhooks {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
