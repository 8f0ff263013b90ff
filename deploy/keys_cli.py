"""``refold keys add | list | revoke``: the API keys of the HTTP services.

Keys live in Redis (``REFOLD_REDIS__*``: url, username, password, key_prefix), hashed; every
replica of ``refold serve`` sees a key added or revoked within a second, without a restart.
Each record is also journaled to Kafka (``REFOLD_KAFKA__*``; :mod:`refold.services.auth.journal`),
from which an empty store is filled again.
This module is the only one that reads the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from refold.contracts.cli_parser import CommandParser
from refold.contracts.settings import StackSettings
from refold.contracts.store.connect import redis_client
from refold.services.auth.errors import ApiKeyError, ApiKeyStoreError
from refold.services.auth.journal import ApiKeyJournal, journal_topic
from refold.services.auth.keys import SCOPES, ApiKey, ApiKeyStore

__all__ = ["build_parser", "main"]

_EXAMPLES = """examples:
  refold keys add --name checkout --scope ingest
  refold keys add --name dashboards --scope query --expires-in-days 90
  refold keys add --name ops --scope admin --json
  refold keys list
  refold keys revoke checkout          # by name, id, or the key itself

The key is printed once, by `add`: Redis keeps only its SHA-256. Send it as
`Authorization: Bearer <key>` or `X-API-Key: <key>`. Scopes: ingest (POST /v1/events),
query (reads, control listings), admin (everything, including replays, rollback and gc).
Each key's record (its hash, never the key) is also journaled to the compacted topic
<key prefix>.api-keys: a Redis that restarted empty gets its keys back from it.
Settings: REFOLD_REDIS__URL, REFOLD_REDIS__USERNAME, REFOLD_REDIS__PASSWORD,
REFOLD_REDIS__KEY_PREFIX (the same as the services'), REFOLD_KAFKA__* (the journal).
"""
_DAY_S = 86_400


def build_parser() -> argparse.ArgumentParser:
    """The ``refold keys`` command line."""
    parser = CommandParser(
        prog="refold keys",
        description="Add, list and revoke the API keys of the HTTP services (refold serve).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser(
        "add",
        help="make a key and print it (once)",
        description="Make an API key with scopes and print it: it is shown only this once.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument(
        "--name",
        required=True,
        help="who or what the key is for (unique among the keys not revoked)",
    )
    add.add_argument(
        "--scope",
        dest="scopes",
        action="append",
        required=True,
        choices=SCOPES,
        help="what it may do, repeatable: ingest, query, admin (admin implies the others)",
    )
    add.add_argument(
        "--expires-in-days",
        type=float,
        metavar="DAYS",
        help="it stops working after this many days (default: never)",
    )
    add.add_argument("--json", action="store_true", help="as JSON (the key and its record)")
    listing = sub.add_parser("list", help="the keys (never the keys themselves)")
    listing.add_argument("--all", action="store_true", help="revoked keys too")
    listing.add_argument("--json", action="store_true", help="as JSON")
    revoke = sub.add_parser(
        "revoke",
        help="revoke a key by id, name or the key itself",
        description="Revoke a key: every replica of the services refuses it within a second.",
    )
    revoke.add_argument("key", metavar="ID_OR_NAME", help="the key's id, its name, or the key")
    revoke.add_argument("--json", action="store_true", help="as JSON")
    return parser


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _row(key: ApiKey, now_ms: int) -> dict[str, object]:
    return {**key.describe(), "status": key.status(now_ms)}


def _add(args: argparse.Namespace, store: ApiKeyStore, journal: ApiKeyJournal) -> int:
    days = args.expires_in_days
    presented = store.add(
        args.name, args.scopes, expires_in_s=None if days is None else days * _DAY_S
    )
    key = store.get(presented)
    try:
        journal.record(store, key.id)
    except ApiKeyError:
        store.forget(key.id)  # a key only Redis knows would vanish with it: not added
        raise
    if args.json:
        print(json.dumps({"key": presented, **_row(key, store.now_ms())}, indent=2))
        return 0
    expiry = f", expires {_when(key.expires_at)}" if key.expires_at is not None else ""
    print(
        f"added key {key.id} ({key.name!r}, scopes {', '.join(key.scopes)}{expiry}).\n"
        f"The key, shown only now (store it as a secret):\n\n  {presented}\n\n"
        f"Use it:  curl -H 'Authorization: Bearer {presented}' ...\n"
        f"Revoke:  refold keys revoke {key.id}"
    )
    return 0


def _list(args: argparse.Namespace, store: ApiKeyStore, _journal: ApiKeyJournal) -> int:
    keys = store.list(include_revoked=args.all)
    now = store.now_ms()
    if args.json:
        print(json.dumps([_row(k, now) for k in keys], indent=2))
        return 0
    if not keys:
        print("no API keys" + ("" if args.all else " (not revoked)") + ": refold keys add -h")
        return 0
    print(f"{'ID':<16}  {'NAME':<24} {'SCOPES':<20} {'STATUS':<8} {'CREATED':<20} EXPIRES")
    for key in keys:
        print(
            f"{key.id:<16}  {key.name:<24} {','.join(key.scopes):<20} "
            f"{key.status(now):<8} {_when(key.created_at):<20} {_when(key.expires_at)}"
        )
    return 0


def _revoke(args: argparse.Namespace, store: ApiKeyStore, journal: ApiKeyJournal) -> int:
    key = store.revoke(args.key)  # in force at once, whatever the journal says
    try:
        journal.record(store, key.id)
    except ApiKeyError as exc:
        msg = (
            f"key {key.id} is revoked, but {exc}: a Redis restored from the journal would "
            "bring it back. Operator action: run this revoke again once the broker answers."
        )
        raise ApiKeyStoreError(msg) from exc
    if args.json:
        print(json.dumps(_row(key, store.now_ms()), indent=2))
        return 0
    print(f"revoked key {key.id} ({key.name!r}) at {_when(key.revoked_at)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1: the command failed, 2: usage)."""
    args = build_parser().parse_args(argv)
    settings = StackSettings()
    client = redis_client(settings.redis.client_url())
    store = ApiKeyStore(client, settings.redis.key_prefix)
    journal = ApiKeyJournal(
        settings.kafka.as_librdkafka(), journal_topic(settings.redis.key_prefix)
    )
    command = {"add": _add, "list": _list, "revoke": _revoke}[args.command]
    try:
        try:
            journal.restore(store)  # an empty store (Redis restarted empty) gets its keys back
        except ApiKeyError as exc:  # add says so again if it matters; list and revoke go on
            print(f"refold keys: warning: {exc}", file=sys.stderr)
        return command(args, store, journal)
    except ApiKeyError as exc:
        print(f"refold keys {args.command}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
