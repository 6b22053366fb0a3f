"""The fills case: ways of writing `FILL_COPIES` copies into descriptor buffers.

The original worker's per-element torch setitem loop, ``handle.add_copies``,
``handle.add_block_copies`` on consecutive and on shuffled blocks, and a bare numpy slice
assignment (the floor), each timed in batches long enough to time, interleaved per round.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bench._cases import median_of, ops_for, ratio_of
from bench._original import OriginalDescriptorBufferPool
from bench._stats import Measurement, time_ns
from bucketpool import BucketPool, BufferHandle

__all__ = ["BLOCK_BYTES", "FILL_COPIES", "FillsCase"]

FILL_COPIES = 1_024
#: One encoder-cache block: one token's embedding row (3,584 bf16 values of a 7B model).
BLOCK_BYTES = 7_168


_FILL_LABELS = {
    "setitem": "torch setitem loop (the original worker)",
    "add_copies": "handle.add_copies",
    "add_block_copies-consecutive": f"handle.add_block_copies, {FILL_COPIES:,} consecutive blocks",
    "add_block_copies-shuffled": f"handle.add_block_copies, {FILL_COPIES:,} shuffled blocks",
    "numpy": "bare numpy slice assignment",
}


def _fill_calls(handle: BufferHandle, seed: int) -> dict[str, Callable[[], int]]:
    """The fill methods, each a call that writes ``handle.n`` copies and returns descriptors."""
    copies = handle.n
    rng = np.random.default_rng(seed)
    src = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    dst = rng.integers(1 << 12, 1 << 44, copies, dtype=np.int64) * 8
    counts = rng.integers(1, 1 << 13, copies, dtype=np.int64) * 8
    src_list, dst_list, count_list = src.tolist(), dst.tolist(), counts.tolist()
    src_t, dst_t, size_t = OriginalDescriptorBufferPool().acquire(copies)
    src_a, dst_a, size_a = handle.arrays
    src_base, dst_base = (int(rng.integers(1 << 20, 1 << 30)) * 4096 for _ in range(2))
    consecutive: npt.NDArray[np.int64] = np.arange(copies, dtype=np.int64)
    shuffled = (rng.permutation(copies).astype(np.int64), rng.permutation(copies).astype(np.int64))

    def setitem() -> int:
        for i in range(copies):
            src_t[i] = src_list[i]
            dst_t[i] = dst_list[i]
            size_t[i] = count_list[i]
        return copies

    def bare_numpy() -> int:
        src_a[:copies] = src
        dst_a[:copies] = dst
        size_a[:copies] = counts
        return copies

    def blocks(src_blocks: npt.NDArray[np.int64], dst_blocks: npt.NDArray[np.int64]) -> int:
        return handle.add_block_copies(0, src_base, dst_base, src_blocks, dst_blocks, BLOCK_BYTES)

    return {
        "setitem": setitem,
        "add_copies": functools.partial(handle.add_copies, 0, src, dst, counts),
        "add_block_copies-consecutive": functools.partial(blocks, consecutive, consecutive),
        "add_block_copies-shuffled": functools.partial(blocks, *shuffled),
        "numpy": bare_numpy,
    }


def _repeat_call(call: Callable[[], int], calls: int) -> None:
    for _ in range(calls):
        call()


@typing.final
class FillsCase:
    """Ways of writing `FILL_COPIES` copies into descriptor buffers, ns per call."""

    def __init__(self, min_batch_ns: int, seed: int = 0) -> None:
        self.name = "fills"
        self.description = f"{FILL_COPIES:,} random 8-byte aligned copies per call"
        self.samples: dict[str, list[float]] = {name: [] for name in _FILL_LABELS}
        self.labels = dict(_FILL_LABELS)
        #: Method name to descriptors written per call.
        self.descriptors: dict[str, int] = {}
        self._min_batch_ns = min_batch_ns
        self._seed = seed
        self._batches: dict[str, tuple[Callable[[], None], int]] = {}
        self._handle: BufferHandle | None = None

    def setup(self) -> None:
        """Acquire the target buffers (held for the run), size each method's batch."""
        self._handle = BucketPool().acquire(FILL_COPIES)
        for name, call in _fill_calls(self._handle, self._seed).items():
            self.descriptors[name] = call()
            calls = ops_for(functools.partial(_repeat_call, call), self._min_batch_ns, 1 << 20)
            self._batches[name] = (functools.partial(_repeat_call, call, calls), calls)

    def round(self) -> None:
        """One timed batch per method."""
        for name, (batch, calls) in self._batches.items():
            self.samples[name].append(time_ns(batch) / calls)

    def close(self) -> None:
        """Release the target buffers."""
        if self._handle is not None:
            self._handle.release()
            self._handle = None
        self._batches = {}

    def measurements(self) -> dict[str, Measurement]:
        """The targets' ratios, and each method's ns per call."""
        figures = {
            "setitem/add_copies": ratio_of(self.samples, "setitem", "add_copies"),
            "add_copies/numpy": ratio_of(self.samples, "add_copies", "numpy"),
            "add_block_copies-consecutive/add_copies": ratio_of(
                self.samples, "add_block_copies-consecutive", "add_copies"
            ),
            "add_block_copies-shuffled/add_copies": ratio_of(
                self.samples, "add_block_copies-shuffled", "add_copies"
            ),
        }
        for name in _FILL_LABELS:
            figures[f"{name} ns/call"] = median_of(self.samples[name], "ns")
        return figures
