"""The benchmark's baseline behaves as the original pool's documentation says."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench._original import OriginalDescriptorBufferPool, OriginalDescriptorBuffers

TRIPLE = 24  # bytes per descriptor: three int64 entries


def test_fresh_acquire_allocates_exactly_n() -> None:
    pool = OriginalDescriptorBufferPool()
    bufs = pool.acquire(5)
    assert isinstance(bufs, OriginalDescriptorBuffers)
    for tensor in bufs:
        assert tensor.dtype == torch.int64
        assert tensor.dim() == 1
        assert tensor.is_contiguous()
        assert tensor.numel() == 5
    assert len({t.data_ptr() for t in bufs}) == 3
    src, dst, sizes = bufs  # unpacks like the original NamedTuple
    assert src is bufs.src_ptrs
    assert dst is bufs.dst_ptrs
    assert sizes is bufs.sizes


def test_release_then_acquire_same_n_returns_the_same_object() -> None:
    pool = OriginalDescriptorBufferPool()
    bufs = pool.acquire(5)
    pool.release(bufs)
    assert pool.acquire(5) is bufs


def test_smaller_request_reuses_the_larger_triple_unsliced() -> None:
    pool = OriginalDescriptorBufferPool()
    bufs = pool.acquire(100)
    pool.release(bufs)
    again = pool.acquire(3)
    assert again is bufs
    assert again.src_ptrs.numel() == 100  # callers slice [:n]
    view = again.src_ptrs[:3]
    assert view.data_ptr() == again.src_ptrs.data_ptr()


def test_larger_request_drops_the_popped_triple() -> None:
    pool = OriginalDescriptorBufferPool()
    small = pool.acquire(4)
    pool.release(small)
    big = pool.acquire(10)
    assert big is not small
    assert big.src_ptrs.numel() == 10
    assert pool.allocations == 2
    assert pool.bytes_held == 10 * TRIPLE


def test_lifo_and_only_the_top_is_examined() -> None:
    pool = OriginalDescriptorBufferPool()
    big, small = pool.acquire(1000), pool.acquire(10)
    pool.release(big)
    pool.release(small)
    # The top (small) is popped and dropped although `big` below would fit.
    fresh = pool.acquire(500)
    assert fresh is not big
    assert fresh is not small
    assert pool.acquire(1) is big


def test_release_checks_nothing_and_never_frees() -> None:
    pool = OriginalDescriptorBufferPool()
    bufs = pool.acquire(8)
    pool.release(bufs)
    pool.release(bufs)  # a double release is accepted, as in the original
    triples = [pool.acquire(8) for _ in range(2)]
    assert triples[0] is triples[1] is bufs
    many = [pool.acquire(16) for _ in range(20)]
    for triple in many:
        pool.release(triple)
    assert pool.bytes_held == (8 + 20 * 16) * TRIPLE  # nothing freed


def test_counters_change_only_when_allocating() -> None:
    pool = OriginalDescriptorBufferPool()
    assert (pool.allocations, pool.bytes_held, pool.peak_bytes_held) == (0, 0, 0)
    bufs = pool.acquire(64)
    assert (pool.allocations, pool.bytes_held, pool.peak_bytes_held) == (1, 1536, 1536)
    for _ in range(10):
        pool.release(bufs)
        bufs = pool.acquire(32)
    assert (pool.allocations, pool.bytes_held, pool.peak_bytes_held) == (1, 1536, 1536)


def test_peak_is_the_highest_bytes_held() -> None:
    pool = OriginalDescriptorBufferPool()
    pool.release(pool.acquire(1 << 20))
    pool.release(pool.acquire(1 << 21))  # pops and drops the 2**20 triple
    assert pool.bytes_held == (1 << 21) * TRIPLE
    assert pool.peak_bytes_held == (1 << 21) * TRIPLE
    pool.release(pool.acquire(16))  # the 2**21 triple serves it: the spike stays
    assert pool.bytes_held == (1 << 21) * TRIPLE


def test_zero_entries() -> None:
    pool = OriginalDescriptorBufferPool()
    bufs = pool.acquire(0)
    assert bufs.src_ptrs.numel() == 0
    assert pool.bytes_held == 0
    assert pool.allocations == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 300)), max_size=40))
def test_matches_a_model_of_the_documentation(steps: list[tuple[bool, int]]) -> None:
    """A list of capacities, as the documentation describes, predicts every answer."""
    pool = OriginalDescriptorBufferPool()
    model: list[int] = []  # capacities of idle triples, top last
    out: list[OriginalDescriptorBuffers] = []
    allocations = 0
    for is_acquire, value in steps:
        if is_acquire or not out:
            top = model.pop() if model else None
            if top is None or top < value:
                allocations += 1
                expected = value
            else:
                expected = top
            bufs = pool.acquire(value)
            assert bufs.src_ptrs.numel() == expected
            out.append(bufs)
        else:
            bufs = out.pop(value % len(out))
            pool.release(bufs)
            model.append(bufs.src_ptrs.numel())
        held = sum(model) + sum(b.src_ptrs.numel() for b in out)
        assert pool.allocations == allocations
        assert pool.bytes_held == held * TRIPLE
        assert pool.peak_bytes_held >= pool.bytes_held
