"""The leak-site case: the cost of recording a call site, in ns and as a share of the op."""

from __future__ import annotations

import inspect

from _bench_case import run_case

from bench import _sites as sites


def test_the_function_timed_holds_the_expression_and_the_other_does_not() -> None:
    source = inspect.getsource(sites.with_site)
    assert "frame = sys._getframe(1)" in source
    assert "frame.f_code, frame.f_lasti" in source
    assert "_getframe" not in inspect.getsource(sites.without_site)
    assert sites.with_site(7) == sites.without_site(7) == 7
    assert "sys._getframe(1)" in sites.EXPRESSION


def test_site_cost_figures_and_units() -> None:
    case = sites.SiteCostCase(min_pass_ns=10_000, max_ops=50)
    figures = run_case(case, rounds=2)
    assert case.name == "leak-site"
    units = {name: figure.unit for name, figure in figures.items()}
    assert units == {
        "site cost per call": "ns",
        "site cost / with-acquire op": "%",
        "with-acquire op": "ns",
        "function with the site": "ns",
        "function without it": "ns",
    }
    assert all(figure.timed and figure.rounds == 2 for figure in figures.values())
    # The share is the cost over the op, per round, in percent.
    cost = [w - wo for w, wo in zip(case.samples["with"], case.samples["without"], strict=True)]
    shares = sorted(100 * c / op for c, op in zip(cost, case.samples["op"], strict=True))
    assert shares[0] <= figures["site cost / with-acquire op"].value <= shares[-1]
