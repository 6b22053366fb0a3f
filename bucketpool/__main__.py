"""The command line: ``python -m bucketpool bench`` compares the pool with the original.

Usage::

    python -m bucketpool bench [--quick] [--check | --strict-check] [--rounds R] [--ops N]
                               [--budget S] [--trace NAME ... | --replay FILE]
                               [--json PATH] [--plot PATH.png]

With no command it prints the usage and exits 0.  The benchmark itself lives in
`bucketpool.bench`; see its ``_cli`` module for the exit statuses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from bucketpool.bench._cli import PROG, add_bench_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the command line (one subcommand, ``bench``)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tools for the bucketpool descriptor-buffer pool."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_bench_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name; `None` reads `sys.argv`.

    Returns:
        The exit status: 0 after printing the usage (the help) when no command is given, else the
        command's.

    Raises:
        SystemExit: argparse rejected the arguments (status 2) or printed help (status 0).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stdout)
        return 0
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
