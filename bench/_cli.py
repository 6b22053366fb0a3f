"""The command line, ``python -m bench``: arguments, the run, the exit status.

Stdout gets the report; stderr the progress, one line per step; ``--json`` and ``--plot``
files.  Exit status: 0 after a run without ``--check``; with ``--check``, 0 when every
promise holds, 1 when one FAILs, 3 when none FAILs but one is UNSURE or LOADED
(``--strict-check``: goals judged alike); 2 for bad arguments, an output path that cannot
be written, or ``--plot`` without matplotlib (all said before anything runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from bench._json import write_json
from bench._plot import FORMATS, INSTALL, plot, unavailable
from bench._report import WIDTH, render_table
from bench._runner import QUICK, Settings, build_cases, run_benchmark, select_cases, selections
from bench._targets import USAGE_ERROR, exit_status
from bench._traces import CASE_KINDS, builtin_traces

__all__ = ["PROG", "build_parser", "main"]

PROG = "python -m bench"


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the command line."""
    full = Settings()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Time bucketpool's documented step, its fills and its other promises "
        "against the original DescriptorBufferPool, rounds interleaved in one process; "
        "report each ratio with a 95% interval and judge each promise and goal.",
        epilog="exit status: 0 after a run; with --check, 0 when every promise holds, 1 when "
        "one FAILs, 3 when one is UNSURE or LOADED; 2 for a usage error.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.rounds} rounds of {QUICK.ops:,}-step passes, {QUICK.budget_s:g} s for "
        f"more (default: {full.rounds} rounds of {full.ops:,}, {full.budget_s:g} s)",
    )
    parser.add_argument(
        "--rounds", "--repeats", type=_count, metavar="R", help="rounds before judging"
    )
    parser.add_argument("--ops", type=_count, metavar="N", help="steps per trace pass")
    parser.add_argument(
        "--budget", type=_seconds, metavar="S", help="seconds of extra rounds while UNSURE"
    )
    parser.add_argument(
        "--trace",
        action="append",
        metavar="NAME",
        help="run only this case, as the report names it, or family of traces or kind of cases "
        f"(repeatable): {', '.join(selections(full))}",
    )
    parser.add_argument("--verbose", action="store_true", help="every figure and every check")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="also draw each timed ratio with its interval and bounds, coloured by verdict "
        f"({' or '.join(FORMATS)} by the name; needs matplotlib: {INSTALL})",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a promise FAILs, 3 when one is unsure"
    )
    parser.add_argument(
        "--strict-check", action="store_true", help="as --check, goals judged as promises"
    )
    return parser


def _unwritable(path: str) -> str | None:
    """Say why *path* cannot be written, before a run that would be lost."""
    if Path(path).is_dir():
        return f"cannot write {path!r}: it is a folder"
    folder = Path(path).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return f"cannot write {path!r}: its folder does not exist or is not writable"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on *argv* (`None`: ``sys.argv``); return the exit status.

    Raises:
        SystemExit: argparse rejected the arguments (status 2) or printed help (status 0).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot is not None:
        if Path(args.plot).suffix.lower() not in FORMATS:
            parser.error(f"argument --plot: {args.plot!r} must end in {' or '.join(FORMATS)}")
        if (missing := unavailable()) is not None:
            parser.error(f"argument --plot: {missing}")
    for path in (args.json, args.plot):
        if path is not None and (why := _unwritable(path)) is not None:
            print(f"{PROG}: error: {why}", file=sys.stderr)
            return USAGE_ERROR
    base = QUICK if args.quick else Settings()
    settings = attrs.evolve(
        base,
        rounds=args.rounds or base.rounds,
        max_rounds=max(base.max_rounds, args.rounds or 0),
        ops=args.ops or base.ops,
        budget_s=base.budget_s if args.budget is None else args.budget,
        settle_goals=args.strict_check,
    )
    traces = builtin_traces(settings.ops, settings.seed)
    cases = build_cases(settings, traces, CASE_KINDS)
    if args.trace:
        try:
            cases = select_cases(settings, traces, args.trace)
        except ValueError as error:
            parser.error(f"argument --trace: {error}")
    start = time.perf_counter()

    def progress(message: str) -> None:
        head = f"bench {time.perf_counter() - start:6.1f}s "
        lines = textwrap.wrap(message, WIDTH - len(head), subsequent_indent="  ")
        print(head + f"\n{' ' * len(head)}".join(lines), file=sys.stderr, flush=True)

    result = run_benchmark(settings, cases, progress=progress)
    if args.json is not None:
        write_json(result, args.json)
    if args.plot is not None:
        plot(result, args.plot)
    written = [path for path in (args.json, args.plot) if path is not None]
    progress("done" + (f", wrote {' and '.join(written)}" if written else ""))
    check = args.check or args.strict_check
    report = render_table(result, verbose=args.verbose, check=check, strict=args.strict_check)
    sys.stdout.write(report)
    return exit_status(result.checks, strict=args.strict_check) if check else 0
