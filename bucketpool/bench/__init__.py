"""The benchmark behind ``python -m bucketpool bench``: the pool against the original.

Modules, one job each: ``_traces`` (the trace model and replay files), ``_original`` (the
original pool, rebuilt), ``_pools`` (each pool driven as its callers drive it), ``_stats``
(paired ratios, intervals, verdicts), ``_cases`` (the case interface, the traces, parked
handles and debug levels), ``_threads``, ``_fills`` and ``_overhead`` (one case each),
``_targets`` (the targets, as data), ``_runner`` (rounds until the verdicts settle),
``_report`` (table and JSON), ``_plot`` (the PNG) and ``_cli`` (the ``bench`` subcommand).

Dependency-free beyond numpy and, for ``--plot``, matplotlib: pyperf and pytest-benchmark
time one function per worker process or test, and cannot pair rounds of three pools in one
process, which is what cancels the load of a shared machine; a progress bar adds nothing to
one line per step on stderr.
"""

from __future__ import annotations

from bucketpool.bench._runner import BenchResult, Settings, run_benchmark
from bucketpool.bench._targets import TARGETS, Check, TargetSpec

__all__ = ["TARGETS", "BenchResult", "Check", "Settings", "TargetSpec", "run_benchmark"]
