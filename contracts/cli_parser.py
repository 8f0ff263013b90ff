"""The argument parser of every refold command: argparse, plus "did you mean" on a typo.

Python 3.11's argparse names an unknown option or subcommand but suggests nothing (3.14 adds
``suggest_on_error``). :class:`CommandParser` adds the closest known spelling, looking through
its subcommands' options too, so ``replay --proccessor x`` says ``did you mean --processor?``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

__all__ = ["CommandParser", "suggestion"]

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<args>.+)$")
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)'")


def _option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every option string of ``parser`` and of its subcommands' parsers."""
    for action in parser._actions:  # noqa: SLF001 - argparse exposes no public walk
        yield from action.option_strings
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - likewise
            for sub in action.choices.values():
                yield from _option_strings(sub)


def _choices(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:  # noqa: SLF001 - argparse exposes no public walk
        if action.choices is not None:
            yield from (str(c) for c in action.choices)


def suggestion(parser: argparse.ArgumentParser, message: str, given: Sequence[str] = ()) -> str:
    """`` (did you mean ...?)`` for argparse's error ``message``, or "" when nothing is close.

    Args:
        parser: The parser that failed.
        message: Its error message.
        given: The arguments it was given: an unknown option among them may be the cause of
            another error (a required option reported missing because it was mistyped).
    """
    guesses: list[str] = []
    known = sorted(set(_option_strings(parser)))
    unrecognized = _UNRECOGNIZED.search(message)
    words = list(given) + (unrecognized["args"].split() if unrecognized else [])
    for word in words:
        name = word.split("=", 1)[0]
        if name.startswith("-") and name not in known:
            guesses += difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    invalid = _INVALID_CHOICE.search(message)
    if invalid:
        guesses += difflib.get_close_matches(
            invalid["given"], sorted(set(_choices(parser))), n=1, cutoff=0.6
        )
    return f" (did you mean {' or '.join(dict.fromkeys(guesses))}?)" if guesses else ""


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors suggest the closest known spelling."""

    _given: tuple[str, ...] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, remembering the arguments for :meth:`error`."""
        self._given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Print usage and the error (with a suggestion), exit 2 as argparse does."""
        super().error(message + suggestion(self, message, self._given))
