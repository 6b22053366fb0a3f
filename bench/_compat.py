"""Whether the compat drop-in accepts every call the original's callers make (untimed).

The original accepts anything; the drop-in refuses misuse (a double or foreign release) and
nothing else.  `compat_refusals` drives a fresh drop-in through a trace as the original's
callers do; `CompatCase` makes the calls beyond a trace's that they make.  A call that
raises, or a triple shorter than asked, is a refusal.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from bench._stats import Measurement, exact
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool, DescriptorBuffers

__all__ = ["CompatCase", "compat_refusals"]


class _ShortTripleError(Exception):
    """The drop-in handed out fewer entries than asked."""


def _take(pool: DescriptorBufferPool, n: int) -> DescriptorBuffers:
    bufs = pool.acquire(n)
    if min(bufs.src_ptrs[:n].numel(), bufs.dst_ptrs[:n].numel(), bufs.sizes[:n].numel()) < n:
        raise _ShortTripleError(f"acquire({n}) gave {bufs.src_ptrs.numel()} entries")
    return bufs


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence what a refused release leaves behind (a LeakWarning when it is dropped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
        gc.collect()


def compat_refusals(events: Sequence[int]) -> int:
    """Return how many of a trace's *events* a fresh compat drop-in refuses."""
    refused = acquired = 0
    with _quiet():
        pool = DescriptorBufferPool()
        live: dict[int, DescriptorBuffers] = {}
        for event in events:
            try:
                if event >= 0:
                    acquired += 1
                    live[acquired - 1] = _take(pool, event)
                elif (bufs := live.pop(~event, None)) is not None:
                    pool.release(bufs)
            except Exception:
                refused += 1
        live.clear()
    return refused


def _numpy_n(pool: DescriptorBufferPool) -> None:
    bufs = pool.acquire(np.int64(1_196))
    if bufs.src_ptrs.numel() < 1_196:
        raise _ShortTripleError("numpy n")
    pool.release(bufs)


def _any_order(pool: DescriptorBufferPool) -> None:
    held = [_take(pool, n) for n in (64, 64, 4_096, 16)]
    for i in (0, 2, 1, 3):
        pool.release(held[i])


def _other_thread(pool: DescriptorBufferPool) -> None:
    bufs = _take(pool, 256)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:
        worker.submit(pool.release, bufs).result()  # raises what the release raised


def _aliased(_: DescriptorBufferPool) -> None:
    aliased = AliasedDescriptorBufferPool()
    bufs = aliased.acquire(8)
    values = np.arange(8, dtype=np.int64) * 64
    bufs.add_copies(0, values, values + 4096, 64)
    aliased.release(bufs)


_CALLS: dict[str, Callable[[DescriptorBufferPool], None]] = {
    "acquire(0)": lambda pool: pool.release(_take(pool, 0)),
    "acquire(numpy.int64(1196))": _numpy_n,
    "acquire(1 << 20)": lambda pool: pool.release(_take(pool, 1 << 20)),
    "releases out of acquire order": _any_order,
    "release on another thread": _other_thread,
    "six-field pool: add_copies, release": _aliased,
}


@typing.final
class CompatCase:
    """Calls of the original's callers beyond a trace's, made once on fresh drop-ins."""

    def __init__(self) -> None:
        self.name = "compat"
        self.description = "compat drop-in, calls the original accepts: " + "; ".join(_CALLS)
        self.samples: dict[str, list[float]] = {}
        #: The calls refused, with what was raised.
        self.refused: dict[str, str] = {}

    def setup(self) -> None:
        """Make each call on a fresh drop-in; note the ones refused."""
        with _quiet():
            for name, call in _CALLS.items():
                try:
                    call(DescriptorBufferPool())
                except Exception as error:
                    self.refused[name] = f"{type(error).__name__}: {error}"
        if self.refused:
            self.description += "; REFUSED: " + "; ".join(
                f"{k} ({v})" for k, v in self.refused.items()
            )

    def round(self) -> None:
        """Nothing: the figure is exact."""

    def close(self) -> None:
        """Nothing: the pools went at the end of `setup`."""

    def measurements(self) -> dict[str, Measurement]:
        """How many of the calls were refused."""
        return {"refused calls": exact(len(self.refused), "count")}
