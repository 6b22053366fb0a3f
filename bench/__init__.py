"""The benchmark, ``python -m bench`` from a checkout: bucketpool against the original pool.

Not part of the wheel: it measures the package, as a user of its public API, and ships in
the source distribution only.  ``python -m bench --help`` lists the options; the exit
statuses are in ``bench._cli``.

Modules, one job each: ``_traces`` (the built-in traces) and ``_replay`` (replay files),
``_original`` (the original pool, rebuilt), ``_pools`` (each pool driven as its callers
drive it), ``_stats`` (paired ratios, intervals, verdicts), ``_cases`` (the case interface,
the traces and the debug levels), ``_parked``, ``_threads``, ``_fills``, ``_overhead``,
``_sites`` and ``_compat`` (the other cases), ``_targets`` (the promises and goals, as
data), ``_runner`` (rounds until the verdicts settle), ``_report`` (the table), ``_json``
(``--json``), ``_plot`` (``--plot``) and ``_cli`` (the command line).

Dependency-free beyond numpy and, for ``--plot``, matplotlib: pyperf and pytest-benchmark
time one function per worker process or test, and cannot pair rounds of three pools in one
process, which is what cancels the load of a shared machine; a progress bar adds nothing to
one progress line on stderr.
"""

from __future__ import annotations

from bench._runner import BenchResult, Settings, run_benchmark
from bench._targets import GOALS, PROMISES, TARGETS, Check, TargetSpec, exit_status

__all__ = [
    "GOALS",
    "PROMISES",
    "TARGETS",
    "BenchResult",
    "Check",
    "Settings",
    "TargetSpec",
    "exit_status",
    "run_benchmark",
]
