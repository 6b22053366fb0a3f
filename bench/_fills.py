"""The fills cases, one per k of `FILL_SIZES`: writing k copies into descriptor buffers.

``bufs.add_copies(0, src, dst, sizes)`` from numpy int64 arrays and from lists of ints,
against bare numpy writing the same inputs into three preallocated int64 arrays
(``a[0:k] = src`` ...); at `SETITEM_SIZES`, ``t[i] = v`` per entry, ints from the lists, on
the original's three tensors (what its callers do without numpy; linear in k beyond); and
``add_block_copies`` on consecutive and on shuffled blocks.  Each series is timed in batches
long enough to time, interleaved per round.
"""

from __future__ import annotations

import contextlib
import functools
import typing
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from bench._cases import Series, SeriesCase, timed
from bench._original import OriginalDescriptorBufferPool
from bench._pools import random_copies
from bench._stats import ops_for
from bucketpool import BucketPool

__all__ = ["BLOCK_BYTES", "FILL_SIZES", "SETITEM_SIZES", "SOURCES", "FillsCase"]

FILL_SIZES = (16, 64, 256, 4_096, 65_536)
SETITEM_SIZES = (64, 256, 4_096)
#: One encoder-cache block: one token's embedding row (3,584 bf16 values of a 7B model).
BLOCK_BYTES = 7_168
#: The kinds of input the fills read.
SOURCES = ("arrays", "lists")


@typing.final
class FillsCase(SeriesCase):
    """Ways of writing k copies, ns per call (see the module docstring)."""

    per = "call"

    def __init__(self, k: int, min_batch_ns: int, seed: int = 0) -> None:
        ratios = [(f"add_copies/numpy ({s})", f"add_copies ({s})", f"numpy ({s})") for s in SOURCES]
        ratios += [
            (f"{series}/add_copies", series, "add_copies (arrays)")
            for series in ("setitem", "add_block_copies-consecutive", "add_block_copies-shuffled")
        ]
        super().__init__(f"fills-{k}", f"{k:,} random 8-byte aligned copies per call", ratios)
        self.k = k
        self._min_batch_ns = min_batch_ns
        self._seed = seed
        self._held = contextlib.ExitStack()

    def make(self) -> dict[str, Series]:
        """Acquire the buffers (held for the run), size each series' batch."""
        series = {}
        for name, call in self._calls().items():
            calls = ops_for(functools.partial(_repeat, call), self._min_batch_ns, 1 << 20)
            series[name] = timed(calls, _repeat, call, calls)
        return series

    def close(self) -> None:
        """Release the buffers."""
        super().close()
        self._held.close()

    def _calls(self) -> dict[str, Callable[[], object]]:
        k, rng = self.k, np.random.default_rng(self._seed + self.k)
        arrays = random_copies(rng, k)
        lists = tuple(a.tolist() for a in arrays)
        bufs = self._held.enter_context(BucketPool().acquire(k))
        numpy = tuple(np.empty(k, dtype=np.int64) for _ in range(3))
        src_base, dst_base = (int(b) * 4096 for b in rng.integers(1 << 20, 1 << 30, 2))
        consecutive = np.arange(k, dtype=np.int64)
        shuffled = (rng.permutation(k), rng.permutation(k))

        def bare(inputs: Sequence[npt.ArrayLike]) -> None:
            for out, values in zip(numpy, inputs, strict=True):
                out[0:k] = values

        calls: dict[str, Callable[[], object]] = {}
        for source, inputs in zip(SOURCES, (arrays, lists), strict=True):
            calls[f"numpy ({source})"] = functools.partial(bare, inputs)
            calls[f"add_copies ({source})"] = functools.partial(bufs.add_copies, 0, *inputs)
        for name, (src_blocks, dst_blocks) in (
            ("consecutive", (consecutive, consecutive)),
            ("shuffled", shuffled),
        ):
            calls[f"add_block_copies-{name}"] = functools.partial(
                bufs.add_block_copies, 0, src_base, dst_base, src_blocks, dst_blocks, BLOCK_BYTES
            )
        if k in SETITEM_SIZES:
            tensors = OriginalDescriptorBufferPool().acquire(k)

            def setitem() -> None:
                for field, values in zip(tensors, lists, strict=True):
                    for i in range(k):
                        field[i] = values[i]

            calls["setitem"] = setitem
        return calls


def _repeat(call: Callable[[], object], calls: int) -> None:
    for _ in range(calls):
        call()
