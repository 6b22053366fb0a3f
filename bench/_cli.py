"""The command line, ``python -m bench``: arguments, the run, the exit status.

Stdout gets the report: a one-screen summary, or every figure with ``--verbose``; the
line saying what ``--check`` exits with, and why, only with ``--check``.  Stderr gets the
progress: one line rewritten in place on a terminal, a line per step elsewhere (a CI log).

Exit status: 0 after a run without ``--check``.  With ``--check``: 0 when every promise
holds (PASS); 1 when a promise FAILs; 3 when none FAILs but one is UNSURE (its interval
straddles the bound) or LOADED (measured on a loaded machine): a verdict that could not be
given is never 0.  ``--strict-check`` judges the goals as promises.  2, with or without
``--check``: bad arguments, a bad replay file, an output path that cannot be written, or
``--plot`` without matplotlib.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench._json import write_json
from bench._replay import ReplayError, load_replay
from bench._report import matplotlib_available, render_table
from bench._runner import Progress, Settings, build_cases, run_benchmark
from bench._targets import USAGE_ERROR, exit_status
from bench._traces import CASE_KINDS, SELECTIONS, Trace, builtin_traces, select_traces

__all__ = ["PROG", "bench_command", "build_parser", "main"]

PROG = "python -m bench"
_PLOT_EXTRA = "pip install 'bucketpool[plot]'"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the command line, with `bench_command` as its action."""
    full, quick = Settings.for_mode(quick=False), Settings.for_mode(quick=True)
    bench = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Time the original DescriptorBufferPool, BucketPool and the compat drop-in on "
            "the same traces, interleaved round by round in one process; report each ratio "
            "with a 95% interval and judge each promise and goal PASS, FAIL or UNSURE."
        ),
        epilog=(
            "exit status: 0 after a run; with --check, 0 when every promise holds, 1 when one "
            "FAILs, 3 when one is UNSURE or LOADED; 2 for a usage error."
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"{quick.rounds} rounds of {quick.ops:,}-op passes, {quick.budget_s:g} s for "
        f"more (default: {full.rounds} rounds of {full.ops:,} ops, {full.budget_s:g} s)",
    )
    bench.add_argument(
        "--rounds", "--repeats", type=_positive, metavar="R", help="rounds before judging"
    )
    bench.add_argument("--ops", type=_positive, metavar="N", help="acquires per pass")
    bench.add_argument(
        "--budget", type=_seconds, metavar="S", help="seconds of extra rounds while UNSURE"
    )
    source = bench.add_mutually_exclusive_group()
    source.add_argument(
        "--trace",
        action="append",
        choices=SELECTIONS,
        metavar="NAME",
        help=f"run only this trace, family or case (repeatable); one of: {', '.join(SELECTIONS)}",
    )
    source.add_argument(
        "--replay",
        metavar="FILE",
        help="run the three pools on a trace file ('acquire N' / 'release ID' lines)",
    )
    bench.add_argument(
        "--verbose", action="store_true", help="report every figure of every case and every check"
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--plot", metavar="PATH.png", help=f"also draw a PNG (needs {_PLOT_EXTRA})")
    bench.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a promise FAILs, 3 when one is UNSURE or LOADED (goals never fail)",
    )
    bench.add_argument(
        "--strict-check",
        action="store_true",
        help="as --check, with the goals judged as promises",
    )
    return bench


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _unwritable(paths: Sequence[str | None]) -> str | None:
    """Say why an output path cannot be written, before a run that would be lost."""
    for path in paths:
        if path is None:
            continue
        target = Path(path)
        if target.is_dir():
            return f"cannot write {path!r}: it is a folder"
        folder = target.resolve().parent
        if not folder.is_dir():
            return f"cannot write {path!r}: its folder does not exist"
        if not os.access(folder, os.W_OK):
            return f"cannot write {path!r}: its folder is not writable"
    return None


def _progress(start: float) -> Progress:
    """Report to stderr: on a terminal one line, rewritten, that "done" ends."""
    tty = sys.stderr.isatty()

    def report(message: str) -> None:
        line = f"bench {time.perf_counter() - start:6.1f}s {message}"
        if tty:
            line = f"\r\x1b[K{line}" + ("\n" if message.startswith("done") else "")
        else:
            line += "\n"
        sys.stderr.write(line)
        sys.stderr.flush()

    return report


def bench_command(args: argparse.Namespace) -> int:
    """Run the benchmark that *args* (parsed by `build_parser`'s parser) describe.

    Returns:
        The exit status (see the module docstring).
    """
    if args.plot is not None and not matplotlib_available():
        return _error(f"--plot needs matplotlib: {_PLOT_EXTRA}")
    unwritable = _unwritable([args.json, args.plot])
    if unwritable is not None:
        return _error(unwritable)
    settings = Settings.for_mode(
        quick=args.quick,
        rounds=args.rounds,
        ops=args.ops,
        budget_s=args.budget,
        settle_goals=args.strict_check,
    )
    if args.replay is not None:
        try:
            traces: tuple[Trace, ...] = (load_replay(args.replay),)
        except ReplayError as error:
            return _error(str(error))
        kinds: Sequence[str] = ()
    else:
        traces = builtin_traces(settings.ops, settings.seed)
        selections = args.trace or ()
        kinds = [kind for kind in CASE_KINDS if not selections or kind in selections]
        if selections:
            traces = select_traces(traces, selections)
    progress = _progress(time.perf_counter())
    result = run_benchmark(settings, build_cases(settings, traces, kinds), progress=progress)
    if args.json is not None:
        write_json(result, args.json)
    if args.plot is not None:
        from bench._plot import plot  # matplotlib, imported only when asked for

        plot(result, args.plot)
    written = [path for path in (args.json, args.plot) if path is not None]
    progress("done" + "".join(f", wrote {path}" for path in written))
    report = render_table(result, verbose=args.verbose, check=args.check, strict=args.strict_check)
    sys.stdout.write(report)
    sys.stdout.flush()
    if args.check or args.strict_check:
        return exit_status(result.checks, strict=args.strict_check)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name; `None` reads `sys.argv`.

    Returns:
        The exit status (see the module docstring).

    Raises:
        SystemExit: argparse rejected the arguments (status 2) or printed help (status 0).
    """
    args = build_parser().parse_args(argv)
    return bench_command(args)
