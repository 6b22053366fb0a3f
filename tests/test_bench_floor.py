"""The floor case: the skeletons are sound pools, and the case times them beside the pools."""

from __future__ import annotations

import copy
import gc
import pickle

import pytest
from _bench_case import run_case

from bench import _floor as floor


def test_the_with_skeleton_hands_out_n_entries_and_refuses_stale_handles() -> None:
    pool = floor.FloorPool()
    handle = pool.acquire(5)
    with handle as bufs:
        assert [view.shape for view in bufs] == [(5,), (5,), (5,)]
        bufs.sizes.fill_(7)
    with pytest.raises(RuntimeError), handle:
        pass
    with pool.acquire(3) as again:  # the same buffer, new views of the new n
        assert again.sizes.shape == (3,)
        assert again.sizes.data_ptr() == bufs.sizes.data_ptr()


def test_a_with_skeleton_handle_is_not_copied() -> None:
    handle = floor.FloorPool().acquire(2)
    for copier in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            copier(handle)
    handle.__exit__()


def test_the_with_skeleton_takes_back_a_dropped_handle() -> None:
    pool = floor.FloorPool()
    handle = pool.acquire(4)
    buffer = handle._buffer
    del handle
    gc.collect()
    with pool.acquire(4) as bufs:  # the dropped handle's buffer, not a new one
        assert bufs.src_ptrs.data_ptr() == buffer.base.data_ptr()


@pytest.mark.parametrize("kind", [floor.FloorCompat, floor.FloorCompatPop])
def test_the_compat_skeletons_refuse_stale_and_double_releases(kind: type) -> None:
    pool = kind()
    first = pool.acquire(8)
    assert len(first.sizes) == 2048  # the whole buffer, as the original's callers expect
    pool.release(first)
    with pytest.raises(RuntimeError):
        pool.release(first)  # double
    second = pool.acquire(8)  # the same buffer, a tuple of its own
    assert second is not first
    assert second.sizes.data_ptr() == first.sizes.data_ptr()
    with pytest.raises(RuntimeError):
        pool.release(first)  # stale: the buffer is second's now
    pool.release(second)
    dropped = pool.acquire(8)
    address = dropped.sizes.data_ptr()
    del dropped
    gc.collect()
    assert pool.acquire(8).sizes.data_ptr() == address  # the dropped tuple's buffer came back


def test_floor_figures_pair_each_pool_with_its_skeleton() -> None:
    case = floor.FloorCase(min_pass_ns=10_000, max_ops=50)
    figures = run_case(case, rounds=2)
    assert case.name == "floor"
    assert set(figures) == {
        "bucketpool/original",
        "floor-with/original",
        "bucketpool/floor-with",
        "compat/original",
        "floor-compat/original",
        "compat/floor-compat",
        "floor-pop/original",
    }
    assert all(figure.unit == "x" and figure.rounds == 2 for figure in figures.values())
    ratios = sorted(
        ours / skeleton
        for ours, skeleton in zip(case.samples["compat"], case.samples["floor-compat"], strict=True)
    )
    assert ratios[0] <= figures["compat/floor-compat"].value <= ratios[-1]
