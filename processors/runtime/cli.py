"""The one processor command: run registered processors as queries of one Spark application.

``python -m refold.processors NAME [NAME ...]`` (also ``refold process ...``). Processors come from
the ``refold.processors`` entry points; settings from ``REFOLD_KAFKA__*``, ``REFOLD_REDIS__*``,
``REFOLD_SPARK__*``, ``REFOLD_STATE_DIR`` and, per processor, ``REFOLD_<PROCESSOR>__*``. This module
is the only one that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from refold.contracts.cli_parser import CommandParser
from refold.contracts.errors import RefoldError
from refold.contracts.extras import needs_extra
from refold.contracts.logconfig import add_log_format_argument, configure_logging
from refold.contracts.processors import (
    STOP_WITH_PARENT_ENV,
    ProcessorOptions,
    ProcessorSpec,
    options_env_prefix,
)
from refold.contracts.registry import Registry, default_registry, import_reference, with_fallback
from refold.contracts.settings import StackSettings
from refold.contracts.topics import TopicSpec, dead_letter_topic
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.projection import Projection
from refold.processors.runtime.checkpoints import checkpoint_root
from refold.processors.runtime.code_identity import build_fingerprints
from refold.processors.runtime.engines import engine_of
from refold.processors.runtime.output_topics import output_topics
from refold.processors.runtime.runner import (
    GenerationChoice,
    ProcessorJob,
    RunOptions,
    run_processors,
)

__all__ = [
    "ProcessSettings",
    "build_job",
    "build_parser",
    "configured_dead_letter_topic",
    "configured_output_topics",
    "load_options",
    "main",
]

logger = logging.getLogger(__name__)


class ProcessSettings(StackSettings):
    """The shared settings of a processor process (``REFOLD_*``; options: per processor)."""


def _options_class(spec: ProcessorSpec) -> type[ProcessorOptions]:
    if not spec.options:
        return ProcessorOptions
    cls = import_reference(spec.options)
    if not (isinstance(cls, type) and issubclass(cls, ProcessorOptions)):
        msg = f"{spec.name}: options {spec.options!r} is not a ProcessorOptions subclass"
        raise ProcessorConfigError(msg)
    return cls


def load_options(spec: ProcessorSpec, environ: Mapping[str, str]) -> ProcessorOptions:
    """A processor's options from ``REFOLD_<PROCESSOR>__*`` in ``environ``.

    Raises:
        ProcessorConfigError: An unknown option or a value of the wrong type, named.
    """
    cls = _options_class(spec)
    prefix = options_env_prefix(spec.name)
    given = {k: v for k, v in environ.items() if k.upper().startswith(prefix)}
    unknown = sorted(
        k for k in given if k[len(prefix) :].split("__")[0].lower() not in cls.model_fields
    )
    if unknown:
        msg = (
            f"{spec.name}: unknown option(s) {', '.join(unknown)}; known: "
            f"{', '.join(prefix + f.upper() for f in cls.model_fields)}"
        )
        raise ProcessorConfigError(msg)
    from_env = type(
        f"{cls.__name__}FromEnv",
        (BaseSettings, cls),
        {
            "model_config": SettingsConfigDict(
                env_prefix=prefix, env_nested_delimiter="__", extra="ignore", frozen=True
            )
        },
    )
    try:
        loaded = from_env()
        return cls.model_validate(loaded.model_dump())
    except ValidationError as exc:
        msg = f"{spec.name}: invalid options ({prefix}*): {exc}"
        raise ProcessorConfigError(msg) from exc


def configured_dead_letter_topic(spec: ProcessorSpec, environ: Mapping[str, str]) -> str:
    """The dead-letter topic the processor sends to, its ``dead_letter_topic`` option included.

    For commands that name a processor's dead letters without running it (``refold dlq``,
    ``refold topics``): they read the same ``REFOLD_<PROCESSOR>__*`` options the processor does.

    Raises:
        ProcessorConfigError: The processor's options are invalid (it would not start either).
    """
    return dead_letter_topic(spec.name, load_options(spec, environ).dead_letter_topic)


def configured_output_topics(spec: ProcessorSpec, environ: Mapping[str, str]) -> list[str]:
    """The output topics the processor writes (dead letters aside), its options included.

    For ``refold topics``, which creates them before the processor first runs: a pattern
    processor's insights, an output stream, closed windows, late records
    (:func:`~refold.processors.runtime.output_topics.output_topics`). Builds the projection
    (imports its module), as the processor does.

    Raises:
        ProcessorConfigError: The processor's options are invalid (it would not start either).
    """
    options = load_options(spec, environ)
    projection = import_reference(spec.projection)(options)
    return output_topics(projection, spec.event_time, options.windows_topic)


def _topics(spec: ProcessorSpec, options: ProcessorOptions, registry: Registry) -> list[TopicSpec]:
    specs = [registry.topic(name) for name in spec.topics]
    if options.topics is None:
        return specs
    if len(options.topics) != len(specs):
        msg = (
            f"{spec.name}: {options_env_prefix(spec.name)}TOPICS names {len(options.topics)} "
            f"topics, the processor reads {len(specs)} ({', '.join(spec.topics)})"
        )
        raise ProcessorConfigError(msg)
    return [dataclasses.replace(t, name=n) for t, n in zip(specs, options.topics, strict=True)]


def build_job(
    spec: ProcessorSpec, options: ProcessorOptions, registry: Registry, run: RunOptions
) -> ProcessorJob:
    """Everything one processor query needs, resolved from its spec and options."""
    factory = import_reference(spec.projection)
    projection: Projection = factory(options)
    # Fingerprinted right after the import: the process keeps the fingerprint of the code it
    # loaded, whatever happens to the files later (refold.processors.runtime.code_identity).
    build_fingerprints(projection, spec.declared_code)
    if projection.name != spec.name:
        msg = f"{spec.projection} builds a projection named {projection.name!r}, not {spec.name!r}"
        raise ProcessorConfigError(msg)
    run = dataclasses.replace(
        run,
        trigger_interval=options.trigger_interval,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
        max_tasks=options.max_tasks,
        source_format=options.source_format,
        dead_letter_topic=options.dead_letter_topic,
        windows_topic=options.windows_topic,
        # The archive is the cold tier: it never reads below the log start from itself; Spark's
        # JVM source cannot read it (it fails below the log start, as it always did).
        archive_root=run.archive_root
        if engine_of(projection).reads_cold_tier and options.source_format != "kafka"
        else "",
    )
    return ProcessorJob(spec, projection, _topics(spec, options, registry), run)


def _generation(value: str) -> GenerationChoice:
    if value in ("live", "new"):
        return value  # type: ignore[return-value]
    try:
        return int(value)
    except ValueError:
        msg = f"expected live, new or a generation number, got {value!r}"
        raise argparse.ArgumentTypeError(msg) from None


def build_parser() -> argparse.ArgumentParser:
    """The processor command line."""
    empty: list[str] = []
    known = with_fallback(lambda: sorted(default_registry().processors), empty)
    parser = CommandParser(
        prog="refold process",
        description="Run processors as Spark Structured Streaming queries of one application "
        "(one JVM): each keeps its own generation, checkpoint, lease and restarts, and a failed "
        "query stops alone. Settings: REFOLD_KAFKA__*, REFOLD_REDIS__*, REFOLD_SPARK__* "
        "(e.g. REFOLD_SPARK__MASTER=spark://host:7077), REFOLD_STATE_DIR, and per processor "
        "REFOLD_<PROCESSOR>__* (e.g. REFOLD_ORDER_STATE__MAX_TASKS=4). `refold processors` "
        "lists them.",
        epilog=f"registered processors: {', '.join(known) or 'none'}",
    )
    parser.add_argument("names", nargs="+", metavar="NAME", help="processors to run")
    parser.add_argument(
        "--generation",
        type=_generation,
        default="live",
        help="live (default; the first run creates generation 1), new, or N (one processor)",
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help='earliest | latest | Spark JSON {"topic":{"0":42}}; used only '
        "for a generation without checkpoint or applied positions",
    )
    parser.add_argument(
        "--available-now", action="store_true", help="process what is in the log now, then exit"
    )
    parser.add_argument(
        "--ending-offsets",
        default="",
        metavar="JSON",
        help='Spark JSON {"topic":{"0":42}}: per partition, stop before this offset and exit '
        "(replay --until builds a state as of a moment so; refold's sources only)",
    )
    parser.add_argument(
        "--accept-code-change",
        action="store_true",
        help="resume a generation built by other code (records the new fingerprint) instead "
        "of refusing",
    )
    parser.add_argument(
        "--print-fingerprint",
        action="store_true",
        help="print the code's generation fingerprints as JSON and exit",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("REFOLD_LOG_LEVEL", "INFO"),
        help="DEBUG adds Spark's phase timings per batch (default: $REFOLD_LOG_LEVEL or INFO)",
    )
    add_log_format_argument(parser, os.environ)
    return parser


def _jobs(args: argparse.Namespace, settings: ProcessSettings) -> list[ProcessorJob]:
    registry = default_registry()
    names = list(dict.fromkeys(args.names))
    if len(names) > 1 and isinstance(args.generation, int):
        msg = "--generation N names one generation of one processor; run it alone"
        raise ProcessorConfigError(msg)
    root = checkpoint_root(settings.state_dir, settings.spark, key_prefix=settings.redis.key_prefix)
    base = RunOptions(
        generation=args.generation,
        checkpoint_root=root,
        starting_offsets=args.starting_offsets,
        available_now=args.available_now,
        ending_offsets=args.ending_offsets,
        accept_code_change=args.accept_code_change,
        archive_root=str(settings.cold_tier() or ""),
    )
    jobs = []
    for name in names:
        spec = registry.processor(name)
        jobs.append(build_job(spec, load_options(spec, os.environ), registry, base))
    return jobs


# How often the parent watch looks: a stop within a second of the parent's end is plenty.
_PARENT_POLL_S = 1.0


def _stop_with_parent(parent: int) -> None:
    """Stop as on SIGTERM (after the current batch) once process ``parent`` is gone.

    A thread polls ``os.getppid()``: when the parent dies, even by ``kill -9``, this process
    is re-parented and the value changes. Portable, unlike Linux's parent-death signal, and
    the stop is the clean one (the lease is released, the batch finishes).
    """

    def _watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        logger.warning("the process that started this one (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    if os.getppid() != parent:  # already gone before this process got here
        os.kill(os.getpid(), signal.SIGTERM)
        return
    threading.Thread(target=_watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when a processor failed, 2 on bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = ProcessSettings()
    try:
        with needs_extra("refold process"):  # before any work: processors run on Spark
            importlib.import_module("refold.processors.runtime.spark")
        jobs = _jobs(args, settings)
        if args.print_fingerprint:
            prints: dict[str, Any] = {
                j.spec.name: build_fingerprints(j.projection, j.spec.declared_code) for j in jobs
            }
            print(
                json.dumps(prints if len(jobs) > 1 else prints[jobs[0].spec.name], sort_keys=True)
            )
            return 0
    except RefoldError as exc:
        print(f"refold process: {exc}", file=sys.stderr)
        return 2
    configure_logging(
        args.log_level, log_format=args.log_format, environ=os.environ, record_level=True
    )
    parent = os.environ.get(STOP_WITH_PARENT_ENV, "")
    if parent.isdigit():
        _stop_with_parent(int(parent))
    failed = run_processors(jobs, settings.kafka, settings.redis, settings.spark)
    return 1 if failed else 0
