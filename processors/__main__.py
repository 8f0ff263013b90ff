"""``python -m refold.processors NAME [NAME ...]``: the one processor command (runtime/cli.py)."""

from __future__ import annotations

import sys

from refold.processors.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
