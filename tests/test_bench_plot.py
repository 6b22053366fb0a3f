"""``--plot`` draws a PNG of a tiny run (what it shows is checked by eye)."""

from __future__ import annotations

from pathlib import Path

import _bench_case
import pytest

from bench._runner import BenchResult


@pytest.fixture(scope="module")
def tiny_run() -> BenchResult:
    return _bench_case.tiny_run()


def test_plot_writes_a_png(tiny_run: BenchResult, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench._plot import plot

    path = tmp_path / "run.png"
    plot(tiny_run, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
