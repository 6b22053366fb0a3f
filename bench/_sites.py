"""The leak-site case: what recording each acquire's call site would cost (report only).

The pool may record where each acquire came from, for its leak warnings, as
``frame = sys._getframe(1); code, lasti = frame.f_code, frame.f_lasti``.  This times that
expression inside a function against the same function without it, and the
``with pool.acquire(n)`` op, in the same rounds: the cost in ns per call, and as a share
of the op.
"""

from __future__ import annotations

import functools
import sys
import typing
from collections.abc import Callable

from bench._cases import HOT_N, median_of, ops_for
from bench._pools import handle_ops
from bench._stats import Measurement, paired_ratios, relative_spread, summarize, time_ns
from bucketpool import BucketPool

__all__ = ["EXPRESSION", "SiteCostCase", "with_site", "without_site"]

#: The expression measured, as the report shows it.
EXPRESSION = "frame = sys._getframe(1); code, lasti = frame.f_code, frame.f_lasti"


def with_site(n: int) -> int:
    """A stand-in for an acquire that records its caller's code and instruction."""
    frame = sys._getframe(1)
    _code, _lasti = frame.f_code, frame.f_lasti  # stored, as the pool would keep them
    return n


def without_site(n: int) -> int:
    """The same function without the recording."""
    return n


def _calls(function: Callable[[int], int], calls: int) -> None:
    for _ in range(calls):
        function(HOT_N)


def _ops(pool: BucketPool, ops: int) -> None:
    handle_ops(pool, HOT_N, ops, None)


@typing.final
class SiteCostCase:
    """`EXPRESSION` in a function against the same function without it, and the hot op."""

    def __init__(self, min_pass_ns: int, max_ops: int) -> None:
        self.name = "leak-site"
        self.description = (
            f"{EXPRESSION!r} in a function, vs the same function without it; and the "
            f"with pool.acquire({HOT_N:,}) op, in the same rounds"
        )
        self.samples: dict[str, list[float]] = {"with": [], "without": [], "op": []}
        self._min_pass_ns = min_pass_ns
        self._max_ops = max_ops
        self._runs: dict[str, tuple[Callable[[int], None], int]] = {}

    def setup(self) -> None:
        """Size each pass to last long enough (the calls get the same count)."""
        calls = functools.partial(_calls, with_site)
        count = ops_for(calls, self._min_pass_ns, self._max_ops * 100)
        op = functools.partial(_ops, BucketPool())
        self._runs = {
            "with": (calls, count),
            "without": (functools.partial(_calls, without_site), count),
            "op": (op, ops_for(op, self._min_pass_ns, self._max_ops)),
        }

    def round(self) -> None:
        """One timed pass each: with the expression, without it, the op."""
        for name, (run, count) in self._runs.items():
            self.samples[name].append(time_ns(functools.partial(run, count)) / count)

    def close(self) -> None:
        """Drop the pool."""
        self._runs = {}

    def measurements(self) -> dict[str, Measurement]:
        """The cost per call (paired difference), as ns and as a share of the op.

        The op's spread is the load signal.
        """
        samples = self.samples
        cost = [w - wo for w, wo in zip(samples["with"], samples["without"], strict=True)]
        spread = relative_spread(samples["op"])
        share = [100 * ratio for ratio in paired_ratios(cost, samples["op"])]
        return {
            "site cost per call": summarize(cost, "ns", spread=spread),
            "site cost / with-acquire op": summarize(share, "%", spread=spread),
            "with-acquire op": median_of(samples["op"], "ns"),
            "function with the site": median_of(samples["with"], "ns"),
            "function without it": median_of(samples["without"], "ns"),
        }
