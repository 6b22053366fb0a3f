"""`bucketpool.testing`: the host reference swap_blocks_batch, and assert_no_outstanding."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketpool import BucketPool
from bucketpool.testing import assert_no_outstanding, swap_blocks_batch

Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def descriptors(copies: list[tuple[int, int, int]], dtype: torch.dtype = torch.int64) -> Triple:
    """Build the three tensors through numpy, which takes uint64 values of any size."""
    columns = (np.array([c[i] for c in copies], dtype=np.uint64).view(np.int64) for i in range(3))
    src, dst, sizes = (torch.from_numpy(col.copy()).view(dtype) for col in columns)
    return src, dst, sizes


def test_copies_every_range() -> None:
    a = torch.arange(32, dtype=torch.uint8)
    b = torch.zeros(32, dtype=torch.uint8)
    swap_blocks_batch(
        *descriptors([(a.data_ptr(), b.data_ptr() + 8, 4), (a.data_ptr() + 20, b.data_ptr(), 3)])
    )
    expected = torch.zeros(32, dtype=torch.uint8)
    expected[8:12] = a[0:4]
    expected[0:3] = a[20:23]
    assert torch.equal(b, expected)
    assert torch.equal(a, torch.arange(32, dtype=torch.uint8))


def test_uint64_descriptors() -> None:
    a = torch.arange(16, dtype=torch.uint8)
    b = torch.zeros(16, dtype=torch.uint8)
    swap_blocks_batch(*descriptors([(a.data_ptr() + 1, b.data_ptr() + 2, 5)], torch.uint64))
    assert b.tolist() == [0, 0, 1, 2, 3, 4, 5] + [0] * 9


def test_slices_of_larger_buffers_are_read_from_their_offset() -> None:
    a = torch.arange(16, dtype=torch.uint8)
    b = torch.zeros(16, dtype=torch.uint8)
    src, dst, sizes = descriptors([(1, 1, 1), (a.data_ptr(), b.data_ptr(), 16), (1, 1, 1)])
    swap_blocks_batch(src[1:2], dst[1:2], sizes[1:2])
    assert torch.equal(a, b)


def test_zero_copies_do_nothing() -> None:
    empty = torch.empty(0, dtype=torch.int64)
    swap_blocks_batch(empty, empty, empty)
    buf = torch.empty(4, dtype=torch.int64)
    swap_blocks_batch(buf[:0], buf[:0], buf[:0])
    # A zero-byte copy moves nothing (its addresses must still be non-null).
    b = torch.zeros(4, dtype=torch.uint8)
    swap_blocks_batch(*descriptors([(b.data_ptr() + 1, b.data_ptr(), 0)]))
    assert b.tolist() == [0, 0, 0, 0]


def test_overlapping_ranges_follow_memmove_semantics() -> None:
    buf = torch.arange(16, dtype=torch.uint8)
    base = buf.data_ptr()
    swap_blocks_batch(*descriptors([(base, base + 4, 8)]))  # forward overlap
    assert buf.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    buf = torch.arange(16, dtype=torch.uint8)
    base = buf.data_ptr()
    swap_blocks_batch(*descriptors([(base + 4, base, 8)]))  # backward overlap
    assert buf.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 12, 13, 14, 15]


def test_copies_run_in_order() -> None:
    buf = torch.arange(8, dtype=torch.uint8)
    base = buf.data_ptr()
    # The second copy reads what the first one wrote.
    swap_blocks_batch(*descriptors([(base, base + 2, 2), (base + 2, base + 6, 2)]))
    assert buf.tolist() == [0, 1, 0, 1, 4, 5, 0, 1]


def test_descriptors_are_read_before_the_first_copy() -> None:
    src, dst, sizes = descriptors([(1, 1, 1), (1, 1, 1)])
    data = torch.arange(1, 9, dtype=torch.uint8)
    out = torch.zeros(8, dtype=torch.uint8)
    zero = torch.zeros(1, dtype=torch.int64)
    # Copy 0 zeroes the size of copy 1; copy 1 must still move its 8 bytes.
    src[0], dst[0], sizes[0] = zero.data_ptr(), sizes.data_ptr() + 8, 8
    src[1], dst[1], sizes[1] = data.data_ptr(), out.data_ptr(), 8
    swap_blocks_batch(src, dst, sizes)
    assert int(sizes[1]) == 0
    assert torch.equal(out, data)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 63), st.integers(0, 63), st.integers(0, 64)).filter(
            lambda c: max(c[0], c[1]) + c[2] <= 64
        ),
        max_size=8,
    ),
    st.sampled_from([torch.int64, torch.uint64]),
)
def test_matches_a_bytearray_model(copies: list[tuple[int, int, int]], dtype: torch.dtype) -> None:
    initial = bytes(range(64))
    buf = torch.frombuffer(bytearray(initial), dtype=torch.uint8)
    base = buf.data_ptr()
    swap_blocks_batch(*descriptors([(base + s, base + d, n) for s, d, n in copies], dtype))
    model = bytearray(initial)
    for s, d, n in copies:
        model[d : d + n] = model[s : s + n]  # slice assignment copies the source first
    assert bytes(buf.numpy()) == bytes(model)


# --- Rejected input raises and copies nothing ---------------------------------------------


def make_batch(dtype: torch.dtype = torch.int64) -> tuple[Triple, torch.Tensor, torch.Tensor]:
    """Two valid copies from a into b, so a check that ran late would let the first through."""
    a = torch.arange(1, 17, dtype=torch.uint8)
    b = torch.zeros(16, dtype=torch.uint8)
    copies = [(a.data_ptr(), b.data_ptr(), 8), (a.data_ptr() + 8, b.data_ptr() + 8, 8)]
    return descriptors(copies, dtype), a, b


def set_last(column: int, value: int) -> Callable[[Triple], Triple]:
    def change(triple: Triple) -> Triple:
        tensors = list(triple)
        values = tensors[column].numpy().view(np.uint64)
        values[-1] = value
        return tensors[0], tensors[1], tensors[2]

    return change


# Many torch ops lack uint64 kernels; numpy builds the variants for both dtypes.
OTHER = {torch.int64: torch.uint64, torch.uint64: torch.int64}


def via_numpy(array: np.ndarray[Any, Any]) -> torch.Tensor:
    return torch.from_numpy(array)


def replace(column: int, make: Callable[[torch.Tensor], Any]) -> Callable[[Triple], Triple]:
    def change(triple: Triple) -> Triple:
        tensors: list[Any] = list(triple)
        tensors[column] = make(tensors[column])
        return tensors[0], tensors[1], tensors[2]

    return change


REJECTED: list[tuple[str, Callable[[Triple], Triple], type[Exception], str]] = [
    ("null source", set_last(0, 0), ValueError, "src_ptrs[1] is 0"),
    ("null destination", set_last(1, 0), ValueError, "dst_ptrs[1] is 0"),
    ("negative size", set_last(2, 2**64 - 5), ValueError, "sizes[1]"),
    ("size 2**63", set_last(2, 2**63), ValueError, "sizes[1]"),
    ("int32 sizes", replace(2, lambda t: via_numpy(t.numpy().astype(np.int32))), TypeError,
     "int64 or uint64"),
    ("float sources", replace(0, lambda t: via_numpy(t.numpy().astype(np.float64))), TypeError,
     "int64 or uint64"),
    ("mixed dtypes", replace(1, lambda t: t.view(OTHER[t.dtype])), TypeError, "one dtype"),
    ("list sizes", replace(2, lambda t: t.tolist()), TypeError, "torch.Tensor"),
    ("numpy sources", replace(0, lambda t: t.numpy()), TypeError, "torch.Tensor"),
    ("meta sizes", replace(2, lambda t: torch.empty_like(t, device="meta")), TypeError, "cpu()"),
    ("2-D sizes", replace(2, lambda t: t.reshape(1, 2)), ValueError, "1-D"),
    ("0-d sizes", replace(2, lambda t: t[0]), ValueError, "1-D"),
    ("strided dst", replace(1, lambda t: via_numpy(np.repeat(t.numpy(), 2)[::2])), ValueError,
     "contiguous"),
    ("short sizes", replace(2, lambda t: t[:1]), ValueError, "one length"),
    ("long sources", replace(0, lambda t: via_numpy(np.concatenate([t.numpy()] * 2))),
     ValueError, "one length"),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
@pytest.mark.parametrize(
    ("change", "error", "fragment"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_rejected_input_raises_and_copies_nothing(
    change: Callable[[Triple], Triple], error: type[Exception], fragment: str, dtype: torch.dtype
) -> None:
    triple, _, b = make_batch(dtype)
    triple = change(triple)
    with pytest.raises(error, match=re.escape(fragment)):
        swap_blocks_batch(*triple)
    assert int(b.count_nonzero()) == 0


def test_the_unchanged_batch_copies() -> None:
    (src, dst, sizes), a, b = make_batch()
    swap_blocks_batch(src, dst, sizes)
    assert torch.equal(a, b)


# -- assert_no_outstanding --------------------------------------------------------------


def test_assert_no_outstanding_passes_when_everything_is_back() -> None:
    pool = BucketPool()
    with pool.acquire(3):
        pass
    assert_no_outstanding(pool)


def test_assert_no_outstanding_lists_what_is_out() -> None:
    pool = BucketPool(debug="checks")
    first = pool.acquire(3)
    second = pool.acquire(300)
    with pytest.raises(AssertionError) as caught:
        assert_no_outstanding(pool)
    message = str(caught.value)
    assert message.startswith("2 buffer(s) still out of <BucketPool at ")
    assert "n=3 (capacity 16) acquired at " in message
    assert "n=300 (capacity 512) acquired at " in message
    assert message.count("test_testing.py:") == 2
    first.release()
    second.release()
    assert_no_outstanding(pool)


def test_assert_no_outstanding_says_how_to_get_sites() -> None:
    pool = BucketPool()
    handle = pool.acquire(1)
    with pytest.raises(AssertionError, match="use debug=checks or trace=True"):
        assert_no_outstanding(pool)
    handle.release()


def test_assert_no_outstanding_sees_buffers_after_gc_freeze() -> None:
    pool = BucketPool(trace=True)
    handle = pool.acquire(5)
    gc.freeze()  # the handle moves to the permanent generation, out of gc's view
    try:
        with pytest.raises(
            AssertionError, match=r"(?s)1 buffer\(s\) still out.*n=5 .*test_testing.py"
        ):
            assert_no_outstanding(pool)
    finally:
        gc.unfreeze()
    handle.release()
    assert_no_outstanding(pool)


def test_assert_no_outstanding_lists_the_oldest_first() -> None:
    pool = BucketPool()
    handles = [pool.acquire(n) for n in (40, 3, 500)]
    with pytest.raises(AssertionError) as caught:
        assert_no_outstanding(pool)
    lines = str(caught.value).splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["n=40", "n=3", "n=500"]
    for handle in handles:
        handle.release()
