"""A release before the copy ended, on a GPU: `install()`'s op wrapper records a CUDA event.

The wrapped op (`bucketpool._copies.recording`, as ``install()`` wraps vLLM's
``swap_blocks_batch``) uploads the descriptors with non-blocking copies on a stream held
back by a spin, then the hand-out is released at once (vllm-ascend #13894's mistake). The
buffer must stay parked until the upload read it, the next step must get another buffer,
and the uploads must read what the step wrote; ``checks`` names the release. Then the host
time the recording adds per copy, for the benchmark page (not a verdict).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch

from bucketpool import BucketPool, InFlightReleaseWarning, _copies

from ._cuda import stall

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N, CALLS = 4096, 2000


def upload(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """A copy op that reads its descriptors later: non-blocking uploads on the current stream."""
    return [tensor.to("cuda", non_blocking=True) for tensor in (src, dst, sizes)]


def test_an_early_release_parks_until_the_upload_read_it(
    cycles_per_ms: float, summary: dict[str, str]
) -> None:
    summary["early release parked"] = "no"
    op, pool = _copies.recording(upload), BucketPool(pin_memory=True, debug="checks")
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    rng = np.random.default_rng(0)
    steps = [rng.integers(1, 2**40, (3, N)) for _ in range(2)]
    uploads, addresses = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spin = stall(stream, int(200 * cycles_per_ms))
        with torch.cuda.stream(stream):
            for src, dst, counts in steps:
                with pool.acquire(N) as bufs:  # released at once: the uploads are queued
                    bufs.add_copies(0, src, dst, counts)
                    addresses.append(bufs.src_ptrs.data_ptr())
                    uploads.append(op(*bufs))
        pending = not spin.query()  # type: ignore[no-untyped-call]
    stream.synchronize()
    assert pending, "the spin ended before the host was done: rerun on a quieter device"
    assert addresses[0] != addresses[1]  # the first buffer was parked, not handed out again
    for uploaded, expected in zip(uploads, steps, strict=True):
        for tensor, values in zip(uploaded, expected, strict=True):
            assert np.array_equal(tensor.cpu().numpy(), values)
    assert [w.category for w in caught] == [InFlightReleaseWarning]  # once for the pair of lines
    assert pool.collect() == 2
    summary["early release parked"] = "yes"


def test_the_recording_costs_the_host_per_copy(summary: dict[str, str]) -> None:
    op, pool = _copies.recording(upload), BucketPool(pin_memory=True)
    times = {}
    with pool.acquire(16) as bufs:
        for name, call in (("plain", upload), ("recorded", op), ("plain", upload)):
            start = time.perf_counter()
            for _ in range(CALLS):
                call(*bufs)
            times[name] = (time.perf_counter() - start) / CALLS  # the second "plain" is kept
        torch.cuda.synchronize()
    pool.synchronize()
    extra = (times["recorded"] - times["plain"]) * 1e6
    summary["record per copy"] = f"{extra:+.1f} µs over {times['plain'] * 1e6:.1f} µs"
