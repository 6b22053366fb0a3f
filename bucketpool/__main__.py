"""The command line: ``python -m bucketpool bench`` compares the pool with the original.

Usage::

    python -m bucketpool [bench] [--quick] [--repeats R] [--ops N]
                         [--trace NAME ... | --replay FILE] [--json PATH] [--plot PATH.png]

With no arguments it runs ``bench`` with the defaults.  The table goes to stdout, progress
to stderr.  Exit status: 0 after a run (whatever the targets say), 2 for bad arguments, a
bad replay file, an output path in a missing folder, or ``--plot`` without matplotlib.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bucketpool import _bench

__all__ = ["build_parser", "main"]

_PROG = "python -m bucketpool"
_PLOT_EXTRA = "pip install 'bucketpool[plot]'"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the command line (one subcommand, ``bench``)."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Tools for the bucketpool descriptor-buffer pool.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="compare bucketpool with the original pool (the default command)",
        description=(
            "Time the original DescriptorBufferPool, BucketPool and the compat drop-in on "
            "the same traces, interleaved in one process, and check the targets."
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"{_bench.QUICK_REPEATS} repeats of {_bench.QUICK_OPS:,}-op traces "
        f"(default: {_bench.DEFAULT_REPEATS} repeats of {_bench.DEFAULT_OPS:,} ops)",
    )
    bench.add_argument(
        "--repeats", type=_positive, metavar="R", help="timed passes per trace and pool"
    )
    bench.add_argument("--ops", type=_positive, metavar="N", help="acquires per built-in trace")
    source = bench.add_mutually_exclusive_group()
    source.add_argument(
        "--trace",
        action="append",
        choices=_bench.SELECTIONS,
        metavar="NAME",
        help="run only this trace or family (repeatable); 'fills' names the fill "
        f"benchmark; one of: {', '.join(_bench.SELECTIONS)}",
    )
    source.add_argument(
        "--replay",
        metavar="FILE",
        help="run the three pools on a trace file ('acquire N' / 'release ID' lines)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--plot", metavar="PATH.png", help=f"also draw a PNG (needs {_PLOT_EXTRA})")
    return parser


def _error(message: str) -> int:
    print(f"{_PROG} bench: error: {message}", file=sys.stderr)
    return 2


def _unwritable(paths: Sequence[str | None]) -> str | None:
    """Say why an output path cannot be written, before a run that would be lost."""
    for path in paths:
        if path is None:
            continue
        target = Path(path)
        if target.is_dir():
            return f"cannot write {path!r}: it is a folder"
        if not target.resolve().parent.is_dir():
            return f"cannot write {path!r}: its folder does not exist"
    return None


def _progress(start: float) -> _bench.Progress:
    def report(message: str) -> None:
        print(f"bench {time.perf_counter() - start:6.1f}s {message}", file=sys.stderr, flush=True)

    return report


def _bench_command(args: argparse.Namespace) -> int:
    if args.plot is not None and not _bench.matplotlib_available():
        return _error(f"--plot needs matplotlib: {_PLOT_EXTRA}")
    unwritable = _unwritable([args.json, args.plot])
    if unwritable is not None:
        return _error(unwritable)
    settings = _bench.BenchSettings.for_mode(quick=args.quick, repeats=args.repeats, ops=args.ops)
    if args.replay is not None:
        try:
            traces: tuple[_bench.Trace, ...] = (_bench.load_replay(args.replay),)
        except _bench.ReplayError as error:
            return _error(str(error))
        fills = False
    else:
        traces = _bench.builtin_traces(settings.ops, settings.seed)
        selections = args.trace or ()
        fills = not selections or "fills" in selections
        if selections:
            traces = _bench.select_traces(traces, selections)
    start = time.perf_counter()
    progress = _progress(start)
    result = _bench.run_benchmark(settings, traces, fills=fills, progress=progress)
    sys.stdout.write(_bench.render_table(result))
    sys.stdout.flush()
    if args.json is not None:
        _bench.write_json(result, args.json)
        progress(f"wrote {args.json}")
    if args.plot is not None:
        _bench.plot(result, args.plot)
        progress(f"wrote {args.plot}")
    progress("done")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name; `None` reads `sys.argv`.  No
            arguments, or options without a command, mean ``bench``.

    Returns:
        The exit status.

    Raises:
        SystemExit: argparse rejected the arguments (status 2) or printed help (status 0).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0].startswith("-") and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "bench")
    args = build_parser().parse_args(arguments)
    return _bench_command(args)


if __name__ == "__main__":
    sys.exit(main())
