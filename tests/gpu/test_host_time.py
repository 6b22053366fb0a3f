"""Host time per step on the GPU, bucketpool against the original pool, both pinned.

A measurement for the benchmark page, not a verdict: nothing here depends on the times.
"""

from __future__ import annotations

import collections
import time
import typing

import numpy as np
import pytest
import torch

from bucketpool import BucketPool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

STEPS, WARMUP, RESAMPLES, LARGEST = 400, 50, 2000, 16_384


class Triple(typing.NamedTuple):
    """vLLM's later six-field descriptor buffers: three tensors and their numpy aliases."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor
    src_np: np.ndarray[typing.Any, np.dtype[np.int64]]
    dst_np: np.ndarray[typing.Any, np.dtype[np.int64]]
    sizes_np: np.ndarray[typing.Any, np.dtype[np.int64]]


class PinnedOriginalPool:
    """bench/_original.py's pool, allocating pinned as vLLM's KV-offload worker does."""

    def __init__(self) -> None:
        self._pool: list[Triple] = []
        self.allocations = 0

    def acquire(self, n: int) -> Triple:
        if self._pool:
            bufs = self._pool.pop()
            if bufs.src_ptrs.numel() >= n:
                return bufs
        src, dst, sizes = (torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(3))
        self.allocations += 1
        return Triple(src, dst, sizes, src.numpy(), dst.numpy(), sizes.numpy())

    def release(self, bufs: Triple) -> None:
        self._pool.append(bufs)


def test_host_time_per_step_against_the_original(summary: dict[str, str]) -> None:
    rng = np.random.default_rng(0)
    sizes = np.exp(rng.uniform(np.log(16), np.log(LARGEST), WARMUP + STEPS)).astype(int)
    src, dst = (rng.integers(1, 2**40, LARGEST) for _ in range(2))
    counts = rng.integers(1, 4096, LARGEST)
    pool, original = BucketPool(pin_memory=True), PinnedOriginalPool()
    in_flight: collections.deque[tuple[torch.cuda.Event, Triple]] = collections.deque()

    def ours(n: int) -> list[torch.Tensor]:
        with pool.acquire(n) as bufs:
            bufs.add_copies(0, src[:n], dst[:n], counts[:n])
            uploaded = [t.to("cuda", non_blocking=True) for t in bufs]
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
            bufs.record_event(done)
        return uploaded

    def theirs(n: int) -> list[torch.Tensor]:
        # The hand-kept return: triples come back once their copies' events are done.
        while in_flight and in_flight[0][0].query():  # type: ignore[no-untyped-call]
            original.release(in_flight.popleft()[1])
        bufs = original.acquire(n)
        bufs.src_np[:n], bufs.dst_np[:n], bufs.sizes_np[:n] = src[:n], dst[:n], counts[:n]
        uploaded = [t[:n].to("cuda", non_blocking=True) for t in bufs[:3]]
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()
        in_flight.append((done, bufs))
        return uploaded

    times = np.zeros((2, WARMUP + STEPS))
    steps = (ours, theirs)
    last: list[list[torch.Tensor]] = [[], []]
    for i, n in enumerate(sizes.tolist()):
        for which in (0, 1) if i % 2 else (1, 0):  # interleaved, each first half the time
            start = time.perf_counter()
            last[which] = steps[which](n)
            times[which, i] = time.perf_counter() - start
    torch.cuda.synchronize()
    for uploaded in last:  # the last step's descriptors, as both uploaded them
        for tensor, expected in zip(uploaded, (src, dst, counts), strict=True):
            assert np.array_equal(tensor.cpu().numpy(), expected[:n])
    pool.synchronize()
    assert pool.outstanding() == []

    ratio, low, high = ratio_interval(times[0, WARMUP:], times[1, WARMUP:], rng)
    misses = pool.stats().misses
    summary["host step bucketpool/original"] = (
        f"{ratio:.2f}x (95% interval {low:.2f}-{high:.2f}, {STEPS} steps, n log-uniform "
        f"16-{LARGEST}; allocations {misses} vs {original.allocations})"
    )


def ratio_interval(
    ours: np.ndarray[typing.Any, np.dtype[np.float64]],
    theirs: np.ndarray[typing.Any, np.dtype[np.float64]],
    rng: np.random.Generator,
) -> tuple[float, float, float]:
    """The ratio of total times, and a 95% bootstrap interval over the paired steps."""
    picks = rng.integers(0, len(ours), (RESAMPLES, len(ours)))
    ratios = ours[picks].sum(axis=1) / theirs[picks].sum(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(ours.sum() / theirs.sum()), float(low), float(high)
