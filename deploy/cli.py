"""``refold``: the local stack, the demo, processors and replay behind one command."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from refold.contracts.cli_parser import CommandParser
from refold.contracts.extras import MissingExtraError, needs_extra
from refold.deploy.local_stack import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    LocalStack,
    LocalStackError,
    ServerStatus,
)
from refold.deploy.processes import stop_hint, tcp_port
from refold.deploy.schema_registry import (
    DEFAULT_REGISTRY_PORT,
    LocalSchemaRegistry,
    SchemaRegistryError,
)
from refold.deploy.stack_security import SCRAM_MECHANISM
from refold.deploy.stack_status import stack_verdict

if TYPE_CHECKING:
    from refold.contracts.kafka.admin import TopicsReport
    from refold.contracts.registry import Registry
    from refold.contracts.topics import TopicSpec

__all__ = ["main"]


def _stack(args: argparse.Namespace) -> LocalStack:
    secure = True if getattr(args, "secure", False) else None  # else: as first started
    cluster = True if getattr(args, "redis_cluster", False) else None
    tiered = True if getattr(args, "tiered_storage", False) else None
    return LocalStack(
        Path(args.state_dir) / "stack",
        args.kafka_port,
        args.redis_port,
        secure=secure,
        redis_cluster=cluster,
        tiered_storage=tiered,
        kafka_nodes=getattr(args, "kafka_nodes", None),  # else: as first started
    )


def _registry(args: argparse.Namespace) -> LocalSchemaRegistry:
    """The stack's schema registry (docs/schema-registry.md, "A local registry")."""
    port = getattr(args, "schema_registry_port", None) or int(
        os.environ.get("REFOLD_SCHEMA_REGISTRY_PORT", DEFAULT_REGISTRY_PORT)
    )
    return LocalSchemaRegistry(Path(args.state_dir) / "stack", port)


def _registry_up(args: argparse.Namespace) -> str:
    """Start the registry when asked, or when this state dir ran one; the lines to print."""
    registry = _registry(args)
    if not (getattr(args, "schema_registry", False) or registry.configured):
        return ""
    was = registry.status()
    try:
        registry.start()
    except SchemaRegistryError as exc:
        raise LocalStackError(str(exc)) from None
    state = f"was running already (pid {was.pid})" if was.running else "up"
    return (
        f"schema registry {state}: Apicurio Registry at {registry.url} (stored in "
        f"{registry.data_dir}: its schema ids survive refold down / up)\n"
        f"         export REFOLD_SCHEMA_REGISTRY__URL={registry.url}\n"
    )


def _tier_line(stack: LocalStack) -> str:
    """Where a tiered broker's remote tier is (docs/local-broker.md, "Tiered storage")."""
    if stack.tiered is None:
        return ""
    return (
        f"tiered storage (KIP-405, LocalTieredStorage): remote tier {stack.tiered.root} "
        f"({_size(stack.tiered.disk_use())}); refold creates its topics tiered (all but "
        "compacted ones)\n"
    )


def _security_lines(stack: LocalStack) -> str:
    """How to reach a secured stack: settings to export, and where the secrets are (not them)."""
    if stack.security is None:
        return ""
    kafka = stack.kafka_settings()
    properties = json.dumps(kafka.client_properties, separators=(",", ":"))
    return (
        f"secured: SASL_SSL with {SCRAM_MECHANISM}, TLS (trust {stack.security.ca_file}), "
        f"Redis ACL user {stack.redis_settings().username}\n"
        f"         export REFOLD_KAFKA__CLIENT_PROPERTIES='{properties}' "
        f"REFOLD_REDIS__USERNAME={stack.redis_settings().username}\n"
        "         and the passwords (never printed) from "
        f"{stack.security.credentials_file}: REFOLD_KAFKA__SECRET_PROPERTIES="
        "'{\"sasl.password\": kafka_password}', REFOLD_REDIS__PASSWORD=redis_password\n"
    )


def _cmd_up(args: argparse.Namespace) -> int:
    stack = _stack(args)
    servers = stack.status()
    running = [s for s in servers if s.running]
    if {s.name for s in running} == {"kafka", "redis"} and len(running) == len(servers):
        print("local stack already running:")
    stack.start(missing_only=True)  # what is down starts; a failure exits non-zero (main)
    registry_lines = _registry_up(args)
    for server in running:
        name = server.name if server.node_id is None else f"{server.name} {server.node_id}"
        print(f"{name} was running already (pid {server.pid}, port {server.port})")
    redis_kind = "Redis" if stack.cluster is None else "a Redis Cluster (3 masters, 3 replicas)"
    kafka_kind = f"Apache Kafka at {stack.bootstrap_servers} (log in "
    kafka_kind += f"{stack.state_dir / 'kafka' / 'data'})"
    if stack.kafka_cluster is not None:
        quorum = stack.kafka_cluster.quorum
        kafka_kind = (
            f"an Apache Kafka cluster of {len(quorum.controllers)} KRaft nodes at "
            f"{stack.bootstrap_servers} (topics: {quorum.replicas} replicas, "
            f"min.insync.replicas {quorum.min_insync}; logs in {stack.kafka_cluster.home})"
        )
    print(
        f"local stack up: {kafka_kind}, {redis_kind} (AOF under {stack.state_dir}) at "
        f"{stack.redis_url}\n"
        f"logs and pid files in {stack.state_dir}\n"
        f"use it:  export REFOLD_KAFKA__BOOTSTRAP_SERVERS={stack.bootstrap_servers} "
        f"REFOLD_REDIS__URL={stack.redis_url}\n{_security_lines(stack)}{_tier_line(stack)}"
        f"{registry_lines}stop it: {stop_hint('refold down', args.state_dir)}"
    )
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    running = [f"{s.name} (port {s.port})" for s in _servers(stack, args) if s.running]
    _registry(args).stop()
    stack.stop()
    print(f"stopped: {', '.join(running)}" if running else "nothing was running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    servers = _servers(stack, args)
    verdict = stack_verdict(servers)
    for server, state in zip(servers, verdict.states, strict=True):
        name = server.name if server.node_id is None else f"{server.name} {server.node_id}"
        print(f"{name:<6} port {server.port:<6} {state:<22} log {server.log_file}")
        if server.name == "schema-registry":
            print(f"       Apicurio Registry, {_registry(args).url}")
        if server.data_dir is not None:
            print(
                f"       Apache Kafka {server.version}, data {server.data_dir} "
                f"({_size(server.disk_bytes)})"
            )
    print(_security_lines(stack) + _tier_line(stack) + _kafka_cluster_lines(stack), end="")
    if verdict.exit_code:
        print(verdict.message(stop_hint("refold up", args.state_dir)), file=sys.stderr)
    return verdict.exit_code


def _kafka_cluster_lines(stack: LocalStack) -> str:
    """A Kafka cluster's active controller and its under-replicated partitions ("" if none)."""
    cluster = stack.kafka_cluster
    if cluster is None or not any(cluster.runs(n) for n in cluster.node_ids):
        return ""
    from confluent_kafka import KafkaException

    from refold.deploy.kafka_cluster import under_replicated

    controller = cluster.active_controller()
    lines = "active controller: " + (
        "none (no quorum)" if controller is None else f"node {controller}"
    )
    try:
        lagging = under_replicated(cluster.bootstrap_servers)
    except KafkaException as exc:
        return f"{lines}\nunder-replicated partitions: unknown (no node answered: {exc})\n"
    shown = ", ".join(map(str, lagging[:8])) + (", ..." if len(lagging) > 8 else "")
    return f"{lines}\nunder-replicated partitions: {len(lagging)}{': ' if lagging else ''}{shown}\n"


def _servers(stack: LocalStack, args: argparse.Namespace) -> list[ServerStatus]:
    """The stack's servers, and its schema registry when this state dir runs one."""
    servers = stack.status()
    registry = _registry(args)
    if registry.configured or registry.status().pid is not None:
        found = registry.status()
        servers.append(
            ServerStatus("schema-registry", found.port, found.pid, found.running, found.log_file)
        )
    return servers


def _size(n: int) -> str:
    """Bytes for a person: ``812 B``, ``4.2 MiB``."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


def _cmd_demo(args: argparse.Namespace) -> int:
    with needs_extra("refold demo", "local"):
        from refold.deploy.demo import run_demo

    return run_demo(orders=args.orders, state_dir=Path(args.state_dir))


def _pass_on(entry: str, args: argparse.Namespace) -> int:
    """Run a command with a command line of its own (``module:main``), imported when used."""
    module, _, function = entry.partition(":")
    with needs_extra(f"refold {args.command}"):
        main_of = getattr(importlib.import_module(module), function)
    return int(main_of(args.rest))


def _cmd_processors(args: argparse.Namespace) -> int:
    from refold.contracts.registry import default_registry

    registry = default_registry()
    rows: list[dict[str, Any]] = []
    for spec in sorted(registry.processors.values(), key=lambda s: s.name):
        keys = {registry.topics[t].key_field if t in registry.topics else "?" for t in spec.topics}
        keyless = spec.key.startswith("(")  # "(none)": no entity (the archive)
        rekeyed = keys != {spec.key} and not keyless
        state = (
            ", ".join(
                [
                    *(f"table {t}" for t in spec.tables),
                    *(f"hash {a}" for a in spec.aggregates),
                    *([f"windows {', '.join(spec.windows)}"] if spec.windows else []),
                ]
            )
            or "(none in Redis but its positions)"
        )
        event_time = spec.event_time
        rows.append(
            {
                "name": spec.name,
                "topics": list(spec.topics),
                "key": spec.key,
                "rekeyed": rekeyed,
                "state": state,
                "windows": list(spec.windows),
                "event_time": None
                if event_time is None
                else {
                    "field": event_time.field,
                    "lateness_ms": event_time.lateness_ms,
                    "late": event_time.late,
                    "late_topic": event_time.late_topic,  # empty: the default, <name>.late
                    "retention_ms": event_time.retention_ms,
                },
                "package": spec.package,
                "description": spec.description,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no processors registered (entry point group refold.processors)")
        return 0
    for row in rows:
        key = f"{row['key']} (re-keyed)" if row["rekeyed"] else row["key"]
        print(f"{row['name']}  [{row['package']}]")
        print(f"  topics  {', '.join(row['topics'])}")
        print(f"  key     {key}")
        print(f"  state   {row['state']}")
        if row["event_time"]:
            times = row["event_time"]
            print(
                f"  time    {times['field']}, lateness {_duration(times['lateness_ms'])}, "
                f"late records: {times['late']}, retention {_duration(times['retention_ms'])}"
            )
        if row["description"]:
            print(f"  about   {row['description']}")
    return 0


def _duration(ms: int) -> str:
    """``30s``, ``5m``, ``24h``, ``1500ms``: the largest unit that divides ``ms``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _cmd_topics(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from refold.contracts.errors import RefoldError
    from refold.contracts.kafka.admin import ensure_topics
    from refold.contracts.registry import default_registry
    from refold.contracts.settings import StackSettings

    registry = default_registry()
    unknown = sorted(set(args.sets) - set(registry.contract_sets))
    if unknown:
        known = ", ".join(sorted(registry.contract_sets))
        print(f"refold topics: unknown contract set(s) {', '.join(unknown)}; known: {known}")
        return 2
    chosen = [registry.contract_sets[n] for n in args.sets or sorted(registry.contract_sets)]
    specs = [t for contract_set in chosen for t in contract_set.topics]
    kafka = StackSettings().kafka
    try:
        # Every processor's dead letters and outputs (with SETs: those of the processors that
        # read their topics), so a consumer started before its processor finds its topic.
        chosen_names = {t.name for t in specs}
        readers = [
            name
            for name, processor in sorted(registry.processors.items())
            if not args.sets or set(processor.topics) & chosen_names
        ]
        outputs = _processor_topics(registry, readers, chosen_names)
        apply = functools.partial(
            ensure_topics, kafka.as_librdkafka(), alter_retention=True, dry_run=args.dry_run
        )
        declared = apply(specs)
        # Output streams are created as a processor creates them: partitions not checked.
        written = apply(outputs, check_partitions=False)
    except (RefoldError, KafkaException) as exc:
        print(f"refold topics: {exc}", file=sys.stderr)
        return 1
    for spec, report in [(s, declared) for s in specs] + [(s, written) for s in outputs]:
        print(_topic_line(spec, report, dry_run=args.dry_run))
    if args.dry_run:
        print("dry run: nothing was created or altered")
    return 0


def _topic_line(spec: TopicSpec, report: TopicsReport, *, dry_run: bool) -> str:
    """One topic of ``refold topics``: partitions, key, retention, and what was done to it."""
    line = (
        f"{spec.name:<28} {spec.partitions:>3} partitions  key {spec.key_field}  "
        f"retention {_retention(spec)}"
    )
    would = "would be " if dry_run else ""
    if spec.name in report.created:
        line += f"  ({would}created)"
    changes = report.changes(spec.name)
    if changes:
        line += f"  ({would}altered: {', '.join(map(str, changes))})"
    return line


def _retention(spec: TopicSpec) -> str:
    """``7d``, ``7d or 1GiB``, ``unlimited``, ``broker default``: what a spec keeps."""
    if spec.retention_ms is None and spec.retention_bytes is None:
        return "broker default"
    parts = []
    if spec.retention_ms is not None:
        parts.append("unlimited time" if spec.retention_ms == -1 else _duration(spec.retention_ms))
    if spec.retention_bytes is not None:
        size = spec.retention_bytes
        parts.append("unlimited size" if size == -1 else f"{_exact_size(size)} per partition")
    return " or ".join(parts)


def _exact_size(size: int) -> str:
    """``1GiB``, ``512MiB``, ``1500B``: the largest binary unit that divides ``size``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def _processor_topics(registry: Registry, names: list[str], listed: set[str]) -> list[TopicSpec]:
    """Each processor's dead-letter topic and the other topics it writes, as it will run.

    Insights, output streams, closed windows and late records, its options included; the
    topics in ``listed`` (the chosen contract sets') left out.
    """
    from refold.contracts.topics import dead_letter_spec
    from refold.processors.runtime.cli import (
        configured_dead_letter_topic,
        configured_output_topics,
    )
    from refold.processors.runtime.output_topics import output_topic_specs

    found: dict[str, TopicSpec] = {}
    for name in names:
        spec = registry.processors[name]
        dead_letters = dead_letter_spec(name, configured_dead_letter_topic(spec, os.environ))
        found.setdefault(dead_letters.name, dead_letters)
        try:
            outputs = configured_output_topics(spec, os.environ)
        except ImportError as exc:  # a missing extra or module: it would not start either
            print(f"refold topics: {name}: output topics not created ({exc})", file=sys.stderr)
            continue
        for output in output_topic_specs(outputs, registry.topics):
            found.setdefault(output.name, output)
    return [t for t in found.values() if t.name not in listed]


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
        type=tcp_port,
        default=default(os.environ.get("REFOLD_KAFKA_PORT", str(DEFAULT_KAFKA_PORT))),
        help="port of the local broker for `up` (env REFOLD_KAFKA_PORT, default "
        f"{DEFAULT_KAFKA_PORT}); `status` and `down` use the port recorded by `up`",
    )
    parser.add_argument(
        "--redis-port",
        type=tcp_port,
        default=default(os.environ.get("REFOLD_REDIS_PORT", str(DEFAULT_REDIS_PORT))),
        help="port of the local redis-server for `up` (env REFOLD_REDIS_PORT, default "
        f"{DEFAULT_REDIS_PORT}); `status` and `down` use the port recorded by `up`",
    )


# Commands with a command line of their own: name -> (help, module). The module's ``main(argv)``
# runs them and its ``build_parser()`` documents them (:func:`command_parsers`).
PASSED_ON: dict[str, tuple[str, str]] = {
    "process": (
        "run processors in one Spark application (see `refold process -h`)",
        "refold.processors.runtime.cli",
    ),
    "replay": ("rebuild a processor's state (see `replay -h`)", "refold.replay.__main__"),
    "tail": (
        "print a topic's records decoded from Avro: events, windows, insights, dead "
        "letters with their headers (see `refold tail -h`)",
        "refold.deploy.tail_cli",
    ),
    "contracts": (
        "check | lock | publish the schema versions (see `refold contracts -h`)",
        "refold.deploy.contracts_cli",
    ),
    "webhooks": (
        "run | log | redrive: deliver critical insights to a webhook (see `refold webhooks -h`)",
        "refold.deploy.webhooks_cli",
    ),
    "dlq": (
        "list a processor's dead letters by reason, redrive them after a fix (`refold dlq -h`)",
        "refold.deploy.dlq_cli",
    ),
    "keys": (
        "add | list | revoke the API keys of the HTTP services (see `refold keys -h`)",
        "refold.deploy.keys_cli",
    ),
    "serve": (
        "the HTTP services: ingest, query, control, /metrics, dashboard (see `refold serve -h`)",
        "refold.deploy.serve_cli",
    ),
    "archive": (
        "backfill | compact | status of the Parquet archive (see `refold archive -h`)",
        "refold.processors.runtime.archive.cli",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The command line.

    Returns:
        The ``refold`` parser; the stack options may come before or after ``up|down|status``.
    """
    parser = CommandParser(
        prog="refold",
        description="refold: Kappa-style event sourcing (Avro contracts -> Kafka -> "
        "PySpark -> Redis).",
    )
    _add_stack_options(parser, after_subcommand=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("up", _cmd_up, "start the local stack (Apache Kafka + redis-server)"),
        ("down", _cmd_down, "stop the local stack"),
        (
            "status",
            _cmd_status,
            "show the local stack (exit 3 when stopped, 6 when a part is down)",
        ),
    ):
        command = sub.add_parser(name, help=text)
        _add_stack_options(command, after_subcommand=True)
        command.set_defaults(func=func)
        if name == "up":
            command.add_argument(
                "--secure",
                action="store_true",
                help="SASL/SCRAM on a TLS listener and a Redis ACL user, with a certificate "
                "and passwords made under <state dir>/stack/secrets (a new stack only: the "
                "broker's storage is formatted with the credential; it stays secured)",
            )
            command.add_argument(
                "--redis-cluster",
                action="store_true",
                help="a local Redis Cluster of 3 masters with 1 replica each, on --redis-port "
                "and the 5 ports after it, instead of one redis-server (a new stack only: it "
                "stays a cluster); clients reach it as redis+cluster://127.0.0.1:<port>",
            )
            command.add_argument(
                "--schema-registry",
                action="store_true",
                help="also a schema registry: Apicurio Registry (Java 21+: "
                "REFOLD_SCHEMA_REGISTRY_JAVA_HOME, JAVA_HOME or /usr/lib/jvm), stored in the "
                "state dir, its Confluent-compatible API at "
                "http://127.0.0.1:<port>/apis/ccompat/v7 (then "
                "`refold up` starts it again; `refold down` stops it)",
            )
            command.add_argument(
                "--schema-registry-port",
                type=tcp_port,
                default=None,
                help="the schema registry's port (env REFOLD_SCHEMA_REGISTRY_PORT, default "
                f"{DEFAULT_REGISTRY_PORT})",
            )
            command.add_argument(
                "--kafka-nodes",
                type=int,
                choices=(1, 3),
                default=None,
                help="3: a local Kafka cluster of three KRaft nodes (each a broker and a "
                "controller) on --kafka-port and the 5 ports after it (clients, then "
                "controllers), topics and internal topics with 3 replicas and "
                "min.insync.replicas=2; 1: the single broker, the default (a new stack only: "
                "a state dir keeps its kind)",
            )
            command.add_argument(
                "--tiered-storage",
                action="store_true",
                help="Kafka's tiered storage (KIP-405) with Kafka's LocalTieredStorage: closed "
                "segments of tiered topics (refold creates every topic but compacted ones so) "
                "are copied to <state dir>/stack/kafka/remote and leave the broker's disk "
                "after their local.retention.ms (default 60 s); consumers still read them from "
                "offset 0 (an existing stack may turn it on; it stays tiered)",
            )
    # `refold cluster up|down|status`: a local Spark standalone master + worker.
    from refold.deploy.cluster_cli import add_cluster_commands

    add_cluster_commands(sub)
    demo = sub.add_parser("demo", help="run the end-to-end demo on a private local stack")
    demo.add_argument(
        "--orders",
        type=int,
        default=10_500,
        help="orders to simulate (~10 events each; default 10500)",
    )
    demo.set_defaults(func=_cmd_demo)
    listing = sub.add_parser(
        "processors", help="list the registered processors: topics, key, state, package"
    )
    listing.add_argument("--json", action="store_true", help="as JSON")
    listing.set_defaults(func=_cmd_processors)
    # Commands with a command line of their own: everything after the name is passed on.
    for name, (text, module) in PASSED_ON.items():
        passing = sub.add_parser(name, help=text, add_help=False)
        passing.add_argument("rest", nargs=argparse.REMAINDER)
        passing.set_defaults(func=functools.partial(_pass_on, f"{module}:main"))
    topics = sub.add_parser(
        "topics",
        help="create the topics of the installed contract sets and every topic their "
        "processors write (dead letters, insights, output streams, closed windows, late "
        "records) where missing; check the partition counts of the others and set the "
        "retention their specs declare where it differs",
    )
    topics.add_argument(
        "sets",
        nargs="*",
        metavar="SET",
        help="contract sets (default: all, and every processor's topics)",
    )
    topics.add_argument(
        "--dry-run",
        action="store_true",
        help="create and alter nothing: say which topics would be created and which "
        "retention configs (TopicSpec.retention_ms/retention_bytes) would change",
    )
    topics.set_defaults(func=_cmd_topics)
    return parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command line refold installs, by its full name (for the generated CLI reference).

    ``refold``, each of its subcommands (and theirs), each command of :data:`PASSED_ON` from
    its module's ``build_parser()`` (``refold serve`` needs the ``serve`` extra, and so on).
    ``replay`` is ``refold replay``, and ``python -m refold.processors`` is ``refold process``.
    """
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found[name] = parser
        for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for sub_name, sub in action.choices.items():
                    if sub_name not in PASSED_ON or name != "refold":
                        walk(f"{name} {sub_name}", sub)

    walk("refold", build_parser())
    for name, (_, module) in PASSED_ON.items():
        with needs_extra(f"refold {name}"):
            walk(f"refold {name}", importlib.import_module(module).build_parser())
    return found


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not hasattr(args, "rest"):  # only the pass-through commands take unknown options
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.rest = [*unknown, *args.rest]
    try:
        return int(args.func(args))
    except LocalStackError as exc:
        print(f"refold: {exc}", file=sys.stderr)
        return 1
    except MissingExtraError as exc:
        print(f"refold: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
