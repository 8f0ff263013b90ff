"""``python -m processors NAME [NAME ...]``: the one processor command (see runtime/cli.py)."""

from __future__ import annotations

import sys

from processors.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
