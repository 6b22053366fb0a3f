"""Statistics and verdicts on synthetic timings: no test here runs or times a pool."""

from __future__ import annotations

import pytest

from bench import _stats as stats
from bench._stats import Measurement

#: Per-round ns of a baseline, and of a pool at about 0.30x of it, with round-to-round noise.
BASELINE = [3000.0, 3100.0, 2950.0, 3050.0, 3020.0, 2980.0, 3070.0]


def scaled(factor: float, jitter: float = 0.0) -> list[float]:
    signs = [1, -1, 0.5, -0.5, 0.25, -0.25, 0]
    return [ns * (factor + jitter * sign) for ns, sign in zip(BASELINE, signs, strict=True)]


def ratio_of(factor: float, jitter: float = 0.0) -> Measurement:
    ratios = stats.paired_ratios(scaled(factor, jitter), BASELINE)
    return stats.summarize(ratios, "x", spread=stats.relative_spread(BASELINE))


def test_paired_ratios_cancel_a_shared_slowdown() -> None:
    slow = [ns * 2 for ns in BASELINE]  # a loaded round slows both series alike
    ratios = stats.paired_ratios([ns * 0.3 for ns in slow], slow)
    assert ratios == pytest.approx([0.3] * len(BASELINE))
    with pytest.raises(ValueError, match="equal, non-zero"):
        stats.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="equal, non-zero"):
        stats.paired_ratios([], [])


def test_summarize_gives_the_median_inside_its_interval() -> None:
    measured = ratio_of(0.3, jitter=0.02)
    assert measured.value == pytest.approx(0.3)
    assert measured.low < measured.value < measured.high
    assert measured.rounds == len(BASELINE)
    assert measured.timed
    assert stats.summarize([1.0, 2.0, 3.0], "ns", seed=1) == stats.summarize(
        [1.0, 2.0, 3.0], "ns", seed=1
    )
    with pytest.raises(ValueError, match="no rounds"):
        stats.summarize([], "x")


def test_the_interval_is_never_narrower_than_the_resolution() -> None:
    measured = ratio_of(0.3)  # identical rounds: the bootstrap alone would give a point
    assert measured.low == pytest.approx(0.3 * (1 - stats.RESOLUTION))
    assert measured.high == pytest.approx(0.3 * (1 + stats.RESOLUTION))
    wide = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0], "x", resolution=0.0)
    assert wide.low < 3.0 < wide.high


def test_verdict_pass_fail_unsure_at_most() -> None:
    assert stats.judge(ratio_of(0.25, 0.01), "<=", 0.30) == "PASS"
    assert stats.judge(ratio_of(0.40, 0.01), "<=", 0.30) == "FAIL"
    assert stats.judge(ratio_of(0.30, 0.01), "<=", 0.30) == "UNSURE"
    # Noisy rounds widen the interval until the verdict cannot be given.
    assert stats.judge(ratio_of(0.27, 0.2), "<=", 0.30) == "UNSURE"


def test_verdict_pass_fail_unsure_at_least() -> None:
    assert stats.judge(ratio_of(4.0, 0.1), ">=", 3.0) == "PASS"
    assert stats.judge(ratio_of(2.0, 0.1), ">=", 3.0) == "FAIL"
    assert stats.judge(ratio_of(3.0, 0.1), ">=", 3.0) == "UNSURE"


def test_exact_values_are_judged_as_points() -> None:
    assert stats.judge(stats.exact(0, "count"), "<=", 0) == "PASS"
    assert stats.judge(stats.exact(1, "count"), "<=", 0) == "FAIL"
    assert not stats.exact(1, "bytes").timed


def test_relative_spread() -> None:
    assert stats.relative_spread([5.0]) == 0.0
    assert stats.relative_spread([0.0, 0.0]) == 0.0
    assert stats.relative_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 3)
    assert stats.relative_spread(BASELINE) < stats.LOADED_SPREAD


def test_ratio_of_pairs_rounds_and_keeps_the_baselines_spread() -> None:
    samples = {"ours": [ns * 0.5 for ns in BASELINE], "base": BASELINE}
    ratio = stats.ratio_of(samples, "ours", "base")
    assert ratio.value == pytest.approx(0.5)
    assert ratio.spread == stats.relative_spread(BASELINE)
    median = stats.median_of(BASELINE)
    assert (median.value, median.unit) == (3020.0, "ns")


def test_time_ns_restores_the_collector() -> None:
    import gc

    assert gc.isenabled()
    seen: list[bool] = []
    assert stats.time_ns(lambda: seen.append(gc.isenabled())) >= 0
    assert seen == [False]
    assert gc.isenabled()
