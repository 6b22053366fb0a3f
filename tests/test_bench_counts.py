"""The ``view-cache`` case: exact counts of the step's torch calls, which CI gates on.

Timings are judged only by ``python -m bench --check`` on a quiet machine; these counts are
the same on any machine, so a change that makes the step cut more view sets, make tensors
on a cache hit, or spend more torch calls on a cut fails here.
"""

from __future__ import annotations

import pytest

from bench import _counts as counts
from bench._targets import PROMISES
from bench._traces import builtin_traces


@pytest.fixture(scope="module")
def figures() -> dict[str, float]:
    case = counts.ViewCacheCase(2_000)
    case.setup()
    return {name: measured.value for name, measured in case.measurements().items()}


def _bound(figure: str) -> float:
    (spec,) = (spec for spec in PROMISES if spec.figure == figure)
    return spec.limit


def test_the_step_cuts_few_view_sets_where_n_varies(figures: dict[str, float]) -> None:
    assert figures[counts.CUTS] <= _bound(counts.CUTS) == 0.6
    for trace in ("loguniform-w1", "loguniform-w4", "loguniform-w16"):
        assert 0 < figures[f"view sets cut per step, {trace}"] < 1


def test_a_handle_that_only_shrinks_cuts_no_set_of_n(figures: dict[str, float]) -> None:
    # With handles in flight the driver calls handle.shrink(end) and never binds the views
    # of n: fewer sets are cut than by the with step, which binds them.
    with_step = figures["view sets cut per step, loguniform-w1"]
    assert figures["view sets cut per step, loguniform-w4"] < with_step - 0.05


def test_a_cache_hit_makes_no_tensor(figures: dict[str, float]) -> None:
    assert figures[counts.HIT_CALLS] == _bound(counts.HIT_CALLS) == 0


def test_a_cut_is_one_torch_call_a_field(figures: dict[str, float]) -> None:
    assert figures[counts.CALLS_PER_CUT] == _bound(counts.CALLS_PER_CUT) == 3


def test_the_counter_sees_the_calls_it_counts() -> None:
    # The counts can fail: a step that cuts every time is counted as such.
    (ramp,) = (trace for trace in builtin_traces(200) if trace.name == "ramp")
    calls = counts.torch_calls(ramp)  # n never the same twice: the warm pass hardly helps
    assert calls[counts.MADE] + calls["resize_"] >= 2.5 * ramp.ops
