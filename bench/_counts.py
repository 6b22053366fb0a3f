"""The ``view-cache`` case: what the documented step asks of torch, counted exactly.

A buffer caches up to 32 view sets (`bucketpool._buffer`): a step whose ``n`` (or
``shrink`` count) has a set cached asks torch for nothing; one that has none *cuts* a set:
three new views, or, once 32 are cached, three in-place ``resize_`` of an old one.  The
torch calls are counted with a `torch.overrides.TorchFunctionMode` over one pass of a warm
pool, so the figures are the same on any machine, and CI gates on them
(``tests/test_bench_counts.py``):

- view sets cut per step on the log-uniform traces (their mean; a handle that only
  shrinks cuts no set of ``n``);
- tensors made per step where ``n`` recurs (``repeated-64``): none, every set is cached;
- torch calls per cut: three, one per field (reads of the version counter, which tell
  whether the cached sets can be trusted, are not counted).
"""

from __future__ import annotations

import collections
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from bench._pools import drivers
from bench._stats import Measurement, exact
from bench._traces import Trace, builtin_traces, select_traces

__all__ = ["CALLS_PER_CUT", "CUTS", "HIT_CALLS", "MADE", "ViewCacheCase", "torch_calls"]

#: The figures.
CUTS = "view sets cut per step, log-uniform n"
HIT_CALLS = "tensors made per step, n recurring"
CALLS_PER_CUT = "torch calls per view set cut"
MADE = "tensors made"  # `torch_calls`' count of the calls that returned a new tensor


class _Counting(TorchFunctionMode):
    """Counts the torch calls made under it by name (version reads apart) and new tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", repr(func))
        if name != "__get__":  # a property read (the version counter), not an op
            self.calls[name] += 1
            if isinstance(result, torch.Tensor) and not any(result is arg for arg in args):
                self.calls[MADE] += 1
        return result


def torch_calls(trace: Trace) -> collections.Counter[str]:
    """The torch calls of one pass of bucketpool's step over *trace*, on a warm pool."""
    (driver,) = drivers(trace, ["bucketpool"])
    driver.run()  # warm: the sets of every n the pass meets are cut once
    counting = _Counting()
    with counting:
        driver.run()
    return counting.calls


@typing.final
class ViewCacheCase:
    """Exact counts of the view cache's work on the log-uniform traces and ``repeated-64``."""

    def __init__(self, ops: int, seed: int = 0) -> None:
        self.name = "view-cache"
        self.description = (
            "torch calls of the step, counted: view sets cut per step (log-uniform n), calls "
            "per step where n recurs, calls per cut"
        )
        self.samples: Mapping[str, Sequence[float]] = {}
        self._ops, self._seed = ops, seed
        self._figures: dict[str, Measurement] = {}

    def setup(self) -> None:
        """Count: the figures are exact."""
        steps = sets = calls = 0
        traces = builtin_traces(self._ops, self._seed)
        for trace in select_traces(traces, ["loguniform", "repeated-64"]):
            counted = torch_calls(trace)
            if trace.name == "repeated-64":
                self._figures[HIT_CALLS] = exact(counted[MADE] / trace.ops, "count")
                continue
            cut = (counted[MADE] + counted["resize_"]) // 3  # (each a new view or resized)
            self._figures[f"view sets cut per step, {trace.name}"] = exact(cut / trace.ops, "count")
            steps, sets = steps + trace.ops, sets + cut
            calls += sum(counted.values()) - counted[MADE]
        if steps:
            self._figures[CUTS] = exact(sets / steps, "count")
            self._figures[CALLS_PER_CUT] = exact(calls / max(sets, 1), "count")

    def round(self) -> None:
        """Nothing: the figures are exact."""

    def close(self) -> None:
        """Nothing: the pools went at the end of `setup`."""

    def measurements(self) -> dict[str, Measurement]:
        """The counts."""
        return dict(self._figures)
