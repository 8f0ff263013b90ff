"""Generate the reference pages at docs build time (mkdocs-gen-files; see mkdocs.yml).

- ``reference/cli.md``: every command line, from its argparse parser (``command_parsers``).
- ``reference/api.md``: every public name of ``import refold``, rendered by mkdocstrings from
  its docstring, grouped by the module that defines it; then those of ``refold.extend``.
"""

from __future__ import annotations

import os

import mkdocs_gen_files

import refold
import refold.extend
from refold.deploy.cli import command_parsers

os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: the same on every machine

with mkdocs_gen_files.open("reference/cli.md", "w") as page:
    page.write(
        "# Command line\n\n"
        "Generated from the parsers at each docs build: this is what `--help` prints. The how-to "
        "for each command, with examples, is in [Commands](../commands.md).\n\n"
    )
    for name, parser in command_parsers().items():
        page.write(f"## {name}\n\n```text\n{parser.format_help()}```\n\n")

with mkdocs_gen_files.open("reference/api.md", "w") as page:
    page.write(
        "# Python API\n\n"
        "Every name of `refold.__all__`, generated from its docstring at each docs build. "
        "Import them from `refold` (`from refold import ProcessorSpec`); the module each is "
        "defined in is internal and may move.\n\n"
    )
    for module, names in refold._EXPORTS.items():  # noqa: SLF001 - the public names' homes
        page.write(f"## `{module}`\n\n")
        for name in names:
            page.write(f"::: {module}.{name}\n\n")
    page.write(
        "# Extension API\n\n"
        "Every name of `refold.extend.__all__`: what a package adds to refold itself (an engine). "
        "Import them from `refold.extend`.\n\n"
    )
    for name in refold.extend.__all__:
        page.write(f"::: refold.extend.{name}\n\n")
