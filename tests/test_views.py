"""The views of a hand-out: exactly n entries of the pool's own memory, reused, never shared."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import data_ptrs

from bucketpool import (
    BucketPool,
    DescriptorBuffers,
    ReleaseError,
)

# -- views ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1196, 4096])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_views_have_exactly_n_entries(n: int, dtype: torch.dtype) -> None:
    pool = BucketPool(dtype=dtype)
    with pool.acquire(n) as bufs:
        assert isinstance(bufs, DescriptorBuffers)
        for view in bufs:
            assert view.shape == (n,)
            assert view.dtype == dtype
            assert view.is_contiguous()
            assert view.device == torch.device("cpu")


def test_views_are_zero_copy_at_offset_zero_and_reused(pool: BucketPool) -> None:
    with pool.acquire(100) as first:
        ptrs = data_ptrs(first)
        first.src_ptrs[:] = torch.arange(100)
    # Another n of the same bucket gets the same buffer, and sees what was written.
    with pool.acquire(120) as second:
        assert data_ptrs(second) == ptrs
        assert torch.equal(second.src_ptrs[:100], torch.arange(100))


def test_same_n_returns_the_same_views(pool: BucketPool) -> None:
    with pool.acquire(77) as first:
        pass
    with pool.acquire(77) as second:
        assert second is first


def test_fields_never_alias(pool: BucketPool) -> None:
    with pool.acquire(64) as bufs:
        bufs.src_ptrs.fill_(1)
        bufs.dst_ptrs.fill_(2)
        bufs.sizes.fill_(3)
        assert bufs.src_ptrs.tolist() == [1] * 64
        assert bufs.dst_ptrs.tolist() == [2] * 64
        assert len(set(data_ptrs(bufs))) == 3


def test_arrays_share_memory_with_views(pool: BucketPool) -> None:
    handle = pool.acquire(10)
    src, dst, sizes = handle.arrays
    assert src.shape == (10,)
    src[:] = np.arange(10)
    sizes[3] = 99
    assert handle.buffers.src_ptrs.tolist() == list(range(10))
    assert int(handle.buffers.sizes[3]) == 99
    assert dst.ctypes.data == handle.buffers.dst_ptrs.data_ptr()
    handle.release()


def test_patching_torch_empty_does_not_reach_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def watched(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args)
        raise AssertionError("the pool used the patched torch.empty")

    monkeypatch.setattr(torch, "empty", watched)
    pool = BucketPool()
    with pool.acquire(100) as bufs:
        assert bufs.src_ptrs.numel() == 100
    assert calls == []


# -- narrowed views ------------------------------------------------------------------------


def test_shrink_resizes_the_bound_views(pool: BucketPool) -> None:
    handle = pool.acquire(6)
    with handle as bufs:
        written = handle.add_copies(0, [1, 2], [3, 4], 5)
        shrunk = handle.shrink(written)
        assert [view.numel() for view in bufs] == [2, 2, 2]
        assert shrunk.src_ptrs.tolist() == [1, 2]
        assert handle.n == 2
        with pytest.raises(ValueError, match="views can only shrink"):
            handle.shrink(3)


def test_shrink_resizes_the_with_views_in_place_and_checks_count(pool: BucketPool) -> None:
    handle = pool.acquire(10)
    with handle as bufs:
        pointer = bufs.src_ptrs.data_ptr()
        views = handle.shrink(np.int64(3))
        assert views is bufs
        assert bufs.src_ptrs.numel() == 3
        assert bufs.src_ptrs.data_ptr() == pointer
        assert handle.n == 3
        with pytest.raises(ValueError, match=r"count=4 is outside 0..n=3"):
            handle.shrink(4)
        with pytest.raises(TypeError, match="not bool"):
            handle.shrink(True)
    with pytest.raises(ReleaseError, match="shrink"):
        handle.shrink(1)
