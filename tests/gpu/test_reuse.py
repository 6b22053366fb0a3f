"""Reuse only after the copy: descriptors an upload has yet to read are never rewritten.

The copy runs on a stream held back by a spin, so its non-blocking upload from the pinned
buffer reads the descriptors only after the host has acquired and filled every step. With
the copy's event recorded, each step gets a buffer of its own; without, the first buffer
comes straight back, and the check must see the uploads read the last step's descriptors.
"""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from bucketpool import BucketPool

from ._cuda import STALLS_MS, stall

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N, STEPS, WIDTH = 16_384, 4, 8  # descriptors per step (128 KiB a tensor), steps, row length


class Outcome(typing.NamedTuple):
    stalled: bool  # the stall outlasted the host's steps: no upload had read its descriptors
    correct: bool  # every element of the target is what the steps' descriptors asked for
    buffers: int  # distinct buffers the steps were handed
    parked: int  # buffers parked once the host was done


def copy_rows(
    source: torch.Tensor,
    target: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """``target[dst[i], :counts[i]] = source[src[i], :counts[i]]``, on the current stream."""
    columns = torch.arange(source.shape[1], device=source.device)
    kept = target.index_select(0, dst)
    rows = torch.where(columns < counts[:, None], source.index_select(0, src), kept)
    target.index_copy_(0, dst, rows)


def run(pool: BucketPool, cycles: int, record: bool) -> Outcome:
    """Copy `STEPS` steps of `N` rows behind a stall of *cycles*; check every element."""
    rng = np.random.default_rng(cycles)
    rows = N * STEPS
    plans = [  # (source rows, target rows, elements per row): each target row written once
        (rng.permutation(rows)[:N], k * N + rng.permutation(N), rng.integers(1, WIDTH + 1, N))
        for k in range(STEPS)
    ]
    whole = np.arange(rows * WIDTH, dtype=np.int64).reshape(rows, WIDTH)
    source = torch.from_numpy(whole).to("cuda")
    target = torch.full((rows, WIDTH), -1, dtype=torch.int64, device="cuda")
    # The steps allocate while the stream stalls: warm torch's page-locked cache, so that
    # their buffers come from it at once rather than from the driver.
    pool.reserve(N, count=STEPS)
    pool.empty_cache()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stall_end = stall(stream, cycles)
    addresses: set[int] = set()
    for src, dst, counts in plans:
        with pool.acquire(N) as bufs:
            bufs.add_copies(0, src, dst, counts)
            addresses.add(bufs.src_ptrs.data_ptr())
            with torch.cuda.stream(stream):  # the uploads and the copy queue behind the stall
                uploaded = [t.to("cuda", non_blocking=True) for t in bufs]
                copy_rows(source, target, *uploaded)
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(stream)  # after the copy that reads the uploaded descriptors
            if record:
                bufs.record_event(done)
    parked = pool.stats().parked
    stalled = not stall_end.query()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    pool.synchronize()
    expected = np.full((rows, WIDTH), -1, dtype=np.int64)
    for src, dst, counts in plans:
        expected[dst] = np.where(np.arange(WIDTH) < counts[:, None], whole[src], expected[dst])
    correct = np.array_equal(target.cpu().numpy(), expected)
    return Outcome(stalled, correct, len(addresses), parked)


@pytest.mark.parametrize("record", [True, False], ids=["with-event", "without-event"])
def test_a_buffer_is_reused_only_after_its_copy(
    record: bool, cycles_per_ms: float, summary: dict[str, str]
) -> None:
    key = "bytes correct with event" if record else "corruption without event"
    summary[key] = "no"
    pool = BucketPool(pin_memory=True)
    run(pool, 1_000, record)  # loads the kernels, which would stall the host on first use
    for ms in STALLS_MS:
        outcome = run(pool, round(ms * cycles_per_ms), record)
        if record:
            assert outcome.correct, f"a copy read descriptors rewritten under it: {outcome}"
        else:
            assert outcome.buffers == 1, f"without an event the buffer comes back: {outcome}"
        if outcome.stalled and (record or not outcome.correct):
            break
    else:
        pytest.fail(
            f"the host's {STEPS} steps did not all land within the {ms} ms stall, {outcome}"
            if not outcome.stalled
            else f"the host rewrote the descriptors within the stall, yet every upload read "
            f"the descriptors of its own step: were they copied before the stall? {outcome}"
        )
    assert pool.outstanding() == []
    if record:  # each step got a buffer of its own, all parked while the uploads waited
        assert (outcome.buffers, outcome.parked) == (STEPS, STEPS)
    summary[key] = f"yes ({ms} ms stall)"
