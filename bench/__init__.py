"""The benchmark, ``python -m bench`` from a checkout: bucketpool against the original pool.

It uses bucketpool's public API only and ships in the source distribution, not the wheel.
Modules: ``_traces`` (the traces and their steps' ends), ``_original`` (the
original pool, rebuilt), ``_pools`` (each pool driven through a trace as its callers
drive it), ``_stats`` (timing, paired ratios, intervals, verdicts), ``_cases`` (the case
interface; the trace, fill-step and debug cases), ``_host_step`` (vLLM's worker step),
``_counts`` (the view cache, counted), ``_fills``, ``_parked``, ``_compat``,
``_kv_offload`` and ``_fork`` (the other cases), ``_targets`` (promises and goals, as
data), ``_runner`` (rounds until the verdicts settle), ``_report`` (the text), ``_json``
(``--json``), ``_plot`` (``--plot``, with the optional matplotlib) and ``_cli`` (the
command line).  Custom rather than pyperf or
pytest-benchmark: those time one function per process or test and cannot pair rounds of
several pools in one process, which is what cancels the load of a shared machine.
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
