"""Static tests: numpy integers are counts and indices, and `Settings` and `DebugLevel` are public.

Checked by mypy, never run (see ``test_api.py`` in this folder for the conventions): every
count, index, address or byte size the API takes is typed `typing.SupportsIndex`, so a
numpy integer, which is what indexing a numpy array gives, passes as it does at run time.
Floats and strings do not.  (numpy's own stubs give ``np.float64`` and ``ndarray`` an
``__index__``, so those pass the type check; at run time a numpy float, or an array that is
not 0-d, is refused.)
"""

from __future__ import annotations

import sys
import typing

import numpy as np
import numpy.typing as npt
import torch

import bucketpool
from bucketpool import BucketPool, DebugLevel, DescriptorBuffers, Settings, bucket_capacity
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool

if typing.TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import assert_type
    else:
        from typing_extensions import assert_type

#: What indexing a numpy array of counts gives: a numpy integer, not an int.
Count = np.int64


def check_pool_counts(pool: BucketPool, n: Count, first: np.intp, size: np.uint64) -> None:
    assert_type(pool.acquire(n), bucketpool.BufferHandle)
    assert_type(pool.acquire(np.int32(3)), bucketpool.BufferHandle)
    assert_type(pool.bucket_capacity(n), int)
    assert_type(bucket_capacity(np.uint16(5)), int)
    assert_type(pool.reserve(n), None)
    assert_type(pool.reserve(n, count=np.int8(2)), None)
    assert_type(pool.trim(np.int64(1 << 20)), int)
    assert_type(pool.trim(max_bytes=size), int)

    handle = pool.acquire(n)
    sources = np.arange(4, dtype=np.uint64)
    assert_type(handle.add_copies(first, sources, sources, size), int)
    assert_type(handle.add_copies(np.int64(0), [1], [2], np.int32(8)), int)
    assert_type(
        handle.add_block_copies(
            first, size, size, np.arange(2), [5, 6], np.int64(64), total_bytes=np.int64(100)
        ),
        int,
    )
    assert_type(handle.shrink(first), DescriptorBuffers)

    pool.acquire(3.5)  # type: ignore[arg-type]
    pool.reserve(3, count=2.0)  # type: ignore[arg-type]
    pool.trim(1.5)  # type: ignore[arg-type]
    handle.add_copies(0.0, [1], [2], 8)  # type: ignore[arg-type]
    handle.add_copies(0, [1], [2], 8.0)  # type: ignore[arg-type]
    handle.add_block_copies(0, 0, 0, [0], [0], 64, total_bytes=1.0)  # type: ignore[arg-type]
    handle.shrink("1")  # type: ignore[arg-type]


def check_with_form(pool: BucketPool, n: Count, first: np.intp) -> None:
    # The views `with` binds reach the fills and shrink, with the handle's signatures.
    with pool.acquire(n) as bufs:
        assert_type(bufs, DescriptorBuffers)
        end = bufs.add_copies(first, np.arange(3), [4, 5, 6], np.int64(8))
        assert_type(end, int)
        assert_type(
            bufs.add_block_copies(end, 0, 4096, [1, 2], range(2), np.int32(64), coalesce=False),
            int,
        )
        assert_type(bufs.shrink(np.int64(end)), DescriptorBuffers)
        src, _dst, _sizes = bufs.shrink(end)
        assert_type(src, torch.Tensor)
        bufs.shrink(1.0)  # type: ignore[arg-type]
        bufs.add_copies(0, [1], [2], 8, 9)  # type: ignore[call-arg]
        assert_type(bufs.add_copies(first, [1], [2], 8, step=np.int64(2)), int)
        bufs.add_copies(0, [1], [2], 8, step=2.0)  # type: ignore[arg-type]


def check_construction_counts(n: Count) -> None:
    assert_type(
        BucketPool(
            min_capacity=np.int64(16),
            max_capacity=np.int64(1 << 20),
            max_cached_bytes=n,
            max_cached_per_bucket=np.int32(8),
            idle_trim_acquires=np.uint32(0),
        ),
        BucketPool,
    )
    BucketPool(max_cached_bytes=1e6)  # type: ignore[arg-type]


def check_compat_counts(n: Count, first: np.intp) -> None:
    pool = DescriptorBufferPool()
    assert_type(pool.acquire(n), DescriptorBuffers)
    aliased = AliasedDescriptorBufferPool().acquire(n)
    assert_type(aliased.add_copies(first, np.arange(2), np.arange(2), np.int64(8)), int)


def check_settings(pool: BucketPool, level: DebugLevel) -> None:
    settings = pool.settings
    assert_type(settings, Settings)
    assert_type(settings, bucketpool.Settings)
    assert_type(settings.debug, DebugLevel)
    assert_type(settings.dtype, torch.dtype)
    assert_type(settings.device, torch.device)
    assert_type(settings.pin_memory, bool)
    assert_type(settings.min_capacity, int)
    assert_type(settings.max_cached_bytes, int)
    assert_type(settings.max_cached_per_bucket, int)
    assert_type(settings.idle_trim_acquires, int)
    assert_type(settings.trace, bool)
    assert_type(BucketPool(debug=level), BucketPool)
    assert_type(BucketPool(debug=settings.debug), BucketPool)

    checks: DebugLevel = "checks"
    assert_type(Settings(debug=checks, max_cached_bytes=np.int64(1 << 20)), Settings)
    wrong: DebugLevel = "verbose"  # type: ignore[assignment]
    BucketPool(debug="loud")  # type: ignore[arg-type]
    settings.max_cached_bytes = 0  # type: ignore[misc]  # frozen
    settings.debug = "off"  # type: ignore[misc]
    del wrong


def check_integer_columns(
    pool: BucketPool,
    int64s: list[np.int64],
    int32s: list[np.int32],
    uint64s: list[np.uint64],
    mixed: list[int | np.integer[typing.Any]],
    indices: tuple[np.intp, ...],
    ints: tuple[int, ...],
    tensor: torch.Tensor,
) -> None:
    # A column is a sequence of ints and numpy integer scalars (what iterating or indexing a
    # numpy array gives), a numpy array of any integer dtype, or a tensor.
    handle = pool.acquire(8)
    assert_type(handle.add_copies(0, int64s, int32s, uint64s), int)
    assert_type(handle.add_copies(0, mixed, indices, ints), int)
    assert_type(
        handle.add_copies(
            0, [np.int64(1), np.int64(2)], [np.int32(3), np.int32(4)], [np.uint64(8), 8]
        ),
        int,
    )
    assert_type(handle.add_copies(0, [1, np.int64(2)], (np.uint8(3), 4), range(8, 10)), int)
    assert_type(handle.add_copies(0, range(2), tuple(range(2)), np.int64(8)), int)
    assert_type(
        handle.add_copies(0, np.zeros(2, np.int8), np.zeros(2, np.int16), np.ones(2, np.int32)),
        int,
    )
    assert_type(
        handle.add_copies(0, np.zeros(2, np.uint8), np.zeros(2, np.uint16), np.ones(2, np.uint32)),
        int,
    )
    assert_type(handle.add_copies(0, np.zeros(2, np.uint64), np.zeros(2, np.intp), tensor), int)
    assert_type(handle.add_block_copies(0, 0, 4096, int64s, int32s, 64), int)
    assert_type(handle.add_block_copies(0, 0, 4096, [np.intp(1), 2], range(2), 64), int)
    assert_type(handle.add_block_copies(0, 0, 4096, uint64s, mixed, 64), int)
    assert_type(
        handle.add_block_copies(0, 0, 4096, np.zeros(2, np.uint64), np.zeros(2, np.int8), 64),
        int,
    )
    with pool.acquire(8) as bufs:
        assert_type(bufs.add_copies(0, int64s, [np.uint32(1)], uint64s), int)
        assert_type(bufs.add_block_copies(0, 0, 4096, int32s, indices, 64), int)
    compat = DescriptorBufferPool().acquire(8)
    compat.add_copies(0, int64s, uint64s, int32s)
    aliased = AliasedDescriptorBufferPool().acquire(8)
    aliased.add_copies(0, [np.int64(1)], range(1), [np.uint64(8)])
    aliased.add_copies(0, mixed, indices, np.zeros(1, np.int16))


def check_non_integer_columns(
    pool: BucketPool,
    floats: list[float],
    numpy_floats: list[np.float64],
    strings: list[str],
    numpy_bools: list[np.bool_],
    zero_d: list[npt.NDArray[np.int64]],
    tensors: list[torch.Tensor],
    bool_array: npt.NDArray[np.bool_],
    float_array: npt.NDArray[np.float64],
    objects: list[object],
) -> None:
    # Each is refused at run time too.  (What passes the type check but is refused at run
    # time: bools, ``[True]``, since ``bool`` is an ``int``; ``bytes``, a ``Sequence[int]``;
    # and, for byte_counts only, any array, which numpy's stubs make a `SupportsIndex`.  A
    # list of 0-d integer tensors runs but is not typed.)
    handle = pool.acquire(8)
    handle.add_copies(0, floats, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, [1], numpy_floats, 8)  # type: ignore[arg-type]
    handle.add_copies(0, [1], [2], strings)  # type: ignore[arg-type]
    handle.add_copies(0, numpy_bools, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, zero_d, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, tensors, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, bool_array, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, [1], float_array, 8)  # type: ignore[arg-type]
    handle.add_copies(0, objects, [1], 8)  # type: ignore[arg-type]
    handle.add_copies(0, "12", [1, 2], 8)  # type: ignore[arg-type]
    handle.add_copies(0, {1, 2}, [1, 2], 8)  # type: ignore[arg-type]
    handle.add_copies(0, [1.0, 2.0], [1, 2], 8)  # type: ignore[list-item]
    handle.add_copies(0, [1, 2], [3, "4"], 8)  # type: ignore[list-item]
    handle.add_copies(0, [1, 2], [3, 4], [np.bool_(True), 8])  # type: ignore[list-item]
    handle.add_block_copies(0, 0, 0, floats, [1], 64)  # type: ignore[arg-type]
    handle.add_block_copies(0, 0, 0, [1], numpy_bools, 64)  # type: ignore[arg-type]
    handle.add_block_copies(0, 0, 0, float_array, [1], 64)  # type: ignore[arg-type]
    handle.add_block_copies(0, 0, 0, [0.5], [1], 64)  # type: ignore[list-item]
    with pool.acquire(8) as bufs:
        bufs.add_copies(0, numpy_floats, [1], 8)  # type: ignore[arg-type]
        bufs.add_block_copies(0, 0, 0, [1], strings, 64)  # type: ignore[arg-type]
    aliased = AliasedDescriptorBufferPool().acquire(8)
    aliased.add_copies(0, floats, [1], 8)  # type: ignore[arg-type]
    aliased.add_copies(0, [1], bool_array, 8)  # type: ignore[arg-type]
