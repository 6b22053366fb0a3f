"""``--plot`` draws a PNG of a tiny run (what it shows is checked by eye, see the README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bucketpool.bench._runner import BenchResult, Settings, build_cases, run_benchmark
from bucketpool.bench._traces import builtin_traces


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    settings = Settings(rounds=2, max_rounds=2, budget_s=0, ops=40, thread_ops=5, parked=20)
    traces = [t for t in builtin_traces(40) if t.name in ("repeated-64", "spike")]
    kinds = ("parked", "threads", "fills", "overhead")
    return run_benchmark(settings, build_cases(settings, traces, kinds))


def test_plot_writes_a_png(tiny_run: BenchResult, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bucketpool.bench._plot import plot

    path = tmp_path / "run.png"
    plot(tiny_run, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
