"""``python -m bench``: run the benchmark from a checkout (see ``bench._cli`` for the options)."""

from __future__ import annotations

import sys

from bench._cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
