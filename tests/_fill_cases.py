"""What the fill tests share: sentinel arrays, a block-by-block reference, the error tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from bucketpool import BucketPool, CapacityError, DescriptorBuffers

DescriptorArrays = tuple[Any, Any, Any]
_POOLS: dict[Any, BucketPool] = {}


def _through_views(arrays: DescriptorArrays, fill: Callable[[DescriptorBuffers], int]) -> int:
    """Run *fill* on a hand-out's views holding *arrays*' values; copy the result back.

    The fills live on the views a pool hands out: this runs the array-based cases there.
    """
    dtype = np.dtype(arrays[0].dtype)
    if dtype not in _POOLS:
        torch_dtype = torch.int64 if dtype == np.int64 else torch.uint64
        _POOLS[dtype] = BucketPool(dtype=torch_dtype, min_capacity=1)
    with _POOLS[dtype].acquire(len(arrays[0])) as bufs:
        for view, array in zip(bufs, arrays, strict=True):
            view.numpy()[:] = array
        try:
            return fill(bufs)
        finally:
            for view, array in zip(bufs, arrays, strict=True):
                array[:] = view.numpy()


def add_copies(arrays: DescriptorArrays, *args: Any, **kwargs: Any) -> int:
    return _through_views(arrays, lambda bufs: bufs.add_copies(*args, **kwargs))


def add_block_copies(arrays: DescriptorArrays, *args: Any, **kwargs: Any) -> int:
    return _through_views(arrays, lambda bufs: bufs.add_block_copies(*args, **kwargs))


SENTINEL = 0x5A5A_5A5A_5A5A_5A5A


HIGH = 2**63 + 12_345  # an address with the top bit set


TOP = 2**64 - 1


DTYPES = [np.int64, np.uint64]


def make_arrays(n: int, dtype: Any = np.int64) -> DescriptorArrays:
    src, dst, sizes = (np.full(n, SENTINEL, dtype=dtype) for _ in range(3))
    return src, dst, sizes


def snapshot(arrays: DescriptorArrays) -> list[list[int]]:
    return [a.view(np.uint64).tolist() for a in arrays]


def unsigned(a: npt.NDArray[Any]) -> list[int]:
    """Read an int64 or uint64 descriptor column back as unsigned addresses."""
    return [int(v) for v in a.view(np.uint64)]


def descriptors(arrays: DescriptorArrays, first: int, end: int) -> list[tuple[int, int, int]]:
    return list(
        zip(
            unsigned(arrays[0][first:end]),
            unsigned(arrays[1][first:end]),
            unsigned(arrays[2][first:end]),
            strict=True,
        )
    )


def reference_blocks(
    src_base: int,
    dst_base: int,
    src_blocks: Sequence[int],
    dst_blocks: Sequence[int],
    block_bytes: int,
    total_bytes: int | None,
    coalesce: bool,
) -> list[tuple[int, int, int]]:
    """The descriptors add_block_copies must write, computed one block at a time."""
    out: list[tuple[int, int, int]] = []
    for i, (s, d) in enumerate(zip(src_blocks, dst_blocks, strict=True)):
        if coalesce and i and s == src_blocks[i - 1] + 1 and d == dst_blocks[i - 1] + 1:
            src, dst, size = out[-1]
            out[-1] = (src, dst, size + block_bytes)
        else:
            out.append((src_base + s * block_bytes, dst_base + d * block_bytes, block_bytes))
    if total_bytes is not None and out:
        src, dst, size = out[-1]
        out[-1] = (src, dst, size - (len(src_blocks) * block_bytes - total_bytes))
    return out


def shuffled_without_runs(count: int, seed: int) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(count).astype(np.int64)
        if not np.any(np.diff(perm) == 1):
            return perm


def descriptor_tensors(
    n: int, dtype: torch.dtype = torch.int64
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], DescriptorArrays]:
    tensors = (
        torch.empty(n, dtype=dtype),
        torch.empty(n, dtype=dtype),
        torch.empty(n, dtype=dtype),
    )
    return tensors, (tensors[0].numpy(), tensors[1].numpy(), tensors[2].numpy())


SOURCE_FORMS: list[Callable[[list[int]], Any]] = [
    list,
    tuple,
    lambda v: np.array(v, dtype=np.int64),
    lambda v: np.array(v, dtype=np.uint64),
    lambda v: np.array(v, dtype=np.int32),
    lambda v: np.array(v, dtype=np.uint16),
    lambda v: np.array(v, dtype=">i8"),  # non-native byte order
    lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],  # a strided view
    lambda v: torch.tensor(v, dtype=torch.int64),
    lambda v: torch.tensor(v, dtype=torch.int32),
    lambda v: torch.from_numpy(np.array(v, dtype=np.uint64)),
]


GOOD: dict[str, Any] = {
    "first": 1,
    "sources": [10, 20],
    "destinations": [30, 40],
    "byte_counts": [5, 6],
}


ERROR_CASES: list[tuple[dict[str, Any], type[Exception], Sequence[str]]] = [
    ({"first": 3}, CapacityError,
     ["add_copies: ", "k=2 copies", "first=3", "n=4", "acquire at least 5 entries"]),
    ({"first": 2, "sources": [1, 2, 3], "destinations": [1, 2, 3], "byte_counts": 1},
     CapacityError, ["add_copies: ", "first=2", "k=3 copies", "n=4"]),
    ({"first": -1}, IndexError, ["add_copies: ", "first=-1"]),
    ({"first": 1.0}, TypeError, ["add_copies: ", "first", "float"]),
    ({"first": True}, TypeError, ["add_copies: ", "first", "bool"]),
    ({"first": np.True_}, TypeError, ["add_copies: ", "first", "bool"]),
    ({"first": "1"}, TypeError, ["add_copies: ", "first", "str"]),
    ({"destinations": [30]}, ValueError, ["2 sources", "1 destinations"]),
    ({"byte_counts": [5, 6, 7]}, ValueError, ["3 byte counts", "2 sources"]),
    ({"byte_counts": np.array([5], dtype=np.int64)}, ValueError, ["1 byte counts"]),
    ({"byte_counts": [5, -1]}, ValueError, ["byte_counts[1]", "-1"]),
    ({"byte_counts": np.array([5, -1])}, ValueError, ["byte_counts[1] = -1"]),
    ({"byte_counts": np.array([-3, 5], dtype=np.int32)}, ValueError, ["byte_counts[0] = -3"]),
    ({"byte_counts": -1}, ValueError, ["add_copies: ", "byte_counts", "-1"]),
    ({"byte_counts": 2**63}, ValueError, ["byte_counts", str(2**63)]),
    ({"byte_counts": np.array([1, 2**63], dtype=np.uint64)}, ValueError,
     [f"byte_counts[1] = {2**63}"]),
    ({"byte_counts": [1, 2**64 + 1]}, ValueError, ["byte_counts[1]", str(2**64 + 1)]),
    ({"byte_counts": True}, TypeError, ["add_copies: ", "bool"]),
    ({"byte_counts": 5.0}, TypeError, ["float"]),
    ({"byte_counts": np.array([True, False])}, TypeError, ["bool"]),
    ({"sources": [10, -20]}, ValueError, ["sources[1] = -20"]),
    ({"sources": np.array([10, -20], dtype=np.int32)}, ValueError, ["sources[1] = -20"]),
    ({"sources": [10, 2**64]}, ValueError, ["sources[1]", str(2**64)]),
    ({"sources": [10, -(2**63) - 1]}, ValueError, ["sources[1]"]),
    ({"sources": [10.0, 20.0]}, TypeError, ["sources", "float"]),
    ({"sources": [10, 20.5]}, TypeError, ["sources", "20.5"]),
    ({"sources": [2**63, 1.5]}, TypeError, ["sources", "1.5"]),
    ({"sources": np.array([1.0, 2.0])}, TypeError, ["sources", "float64"]),
    ({"sources": np.array([True, False])}, TypeError, ["sources", "bool"]),
    ({"sources": [True, False]}, TypeError, ["sources", "bool"]),
    ({"sources": [10, True]}, TypeError, ["sources[1] = True", "bool"]),
    ({"sources": [np.array(True), 10]}, TypeError, ["sources[0]", "ndarray"]),
    ({"destinations": (np.bool_(False), 20)}, TypeError, ["destinations[0]", "bool"]),
    ({"byte_counts": [8, False]}, TypeError, ["byte_counts[1] = False", "bool"]),
    ({"sources": ["10", "20"]}, TypeError, ["sources"]),
    ({"sources": "10"}, TypeError, ["sources", "str"]),
    ({"sources": b"\x01\x02"}, TypeError, ["sources", "bytes"]),
    ({"sources": [object(), object()]}, TypeError, ["sources"]),
    ({"sources": None}, TypeError, ["sources", "NoneType"]),
    ({"sources": 10}, TypeError, ["sources", "int"]),
    ({"sources": (v for v in (10, 20))}, TypeError, ["sources", "generator"]),
    ({"sources": [[10, 20]]}, ValueError, ["sources", "1-D", "(1, 2)"]),
    ({"sources": np.zeros((2, 1), dtype=np.int64)}, ValueError, ["1-D", "(2, 1)"]),
    ({"sources": np.int64(10)}, TypeError, ["sources"]),
    ({"sources": torch.tensor([1.0, 2.0])}, TypeError, ["sources", "float32"]),
    ({"sources": torch.tensor([True, False])}, TypeError, ["sources", "bool"]),
    ({"sources": torch.zeros(2, dtype=torch.bfloat16)}, TypeError, ["sources", "bfloat16"]),
    ({"sources": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["sources", "meta", "CPU"]),
    ({"destinations": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["destinations", "CPU"]),
    ({"byte_counts": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError,
     ["byte_counts", "CPU"]),
]  # fmt: skip


BLOCK_GOOD: dict[str, Any] = {
    "first": 0,
    "src_base": 1 << 20,
    "dst_base": 1 << 30,
    "src_blocks": [0, 2],
    "dst_blocks": [1, 3],
    "block_bytes": 64,
}


BLOCK_ERRORS: list[tuple[dict[str, Any], type[Exception], Sequence[str]]] = [
    ({"first": 3}, CapacityError,
     ["add_block_copies: ", "first=3", "k=2 descriptors", "n=4", "acquire at least 5"]),
    ({"first": -2}, IndexError, ["add_block_copies: ", "first=-2"]),
    ({"first": 0.5}, TypeError, ["add_block_copies: ", "first"]),
    ({"first": np.False_}, TypeError, ["add_block_copies: ", "first", "bool"]),
    ({"src_blocks": list(range(0, 10, 2)), "dst_blocks": list(range(5))}, CapacityError,
     ["add_block_copies: ", "k=5 descriptors", "n=4"]),
    ({"dst_blocks": [1]}, ValueError, ["2 source blocks", "1 destination blocks"]),
    ({"src_blocks": [0, -2]}, ValueError, ["src_blocks[1] = -2"]),
    ({"src_blocks": np.array([0, -2])}, ValueError, ["src_blocks[1] = -2"]),
    ({"dst_blocks": np.array([-1, 3], dtype=np.int16)}, ValueError, ["dst_blocks[0] = -1"]),
    ({"dst_blocks": torch.tensor([1, -3])}, ValueError, ["dst_blocks[1] = -3"]),
    ({"src_blocks": [0.0, 2.0]}, TypeError, ["src_blocks"]),
    ({"src_blocks": np.array([False, True])}, TypeError, ["src_blocks", "bool"]),
    ({"src_blocks": torch.zeros(2, dtype=torch.int64, device="meta")}, TypeError, ["CPU"]),
    ({"block_bytes": 0}, ValueError, ["add_block_copies: ", "block_bytes=0"]),
    ({"block_bytes": -64}, ValueError, ["block_bytes", "-64"]),
    ({"block_bytes": 2**63}, ValueError, ["block_bytes"]),
    ({"block_bytes": 64.0}, TypeError, ["block_bytes", "float"]),
    ({"block_bytes": True}, TypeError, ["add_block_copies: ", "block_bytes", "bool"]),
    ({"block_bytes": np.True_}, TypeError, ["block_bytes", "bool"]),
    ({"total_bytes": True}, TypeError, ["add_block_copies: ", "total_bytes", "bool"]),
    ({"src_base": False}, TypeError, ["add_block_copies: ", "src_base", "bool"]),
    ({"src_base": -1}, ValueError, ["add_block_copies: ", "src_base=-1"]),
    ({"dst_base": 2**64}, ValueError, ["dst_base", str(2**64)]),
    ({"src_base": "0"}, TypeError, ["src_base"]),
    ({"src_base": 2**64 - 64}, ValueError, ["src_blocks", "past the 64-bit address space"]),
    ({"dst_blocks": [1, 2**58]}, ValueError, ["dst_blocks", "2**63 bytes"]),
    ({"dst_blocks": np.array([1, 2**63], dtype=np.uint64)}, ValueError, ["dst_blocks"]),
    ({"total_bytes": 64}, ValueError, ["add_block_copies: ", "total_bytes=64", "65..128"]),
    ({"total_bytes": 129}, ValueError, ["total_bytes=129", "65..128"]),
    ({"total_bytes": 0}, ValueError, ["65..128"]),
    ({"total_bytes": -1}, ValueError, ["65..128"]),
    ({"total_bytes": 100.0}, TypeError, ["total_bytes"]),
    ({"src_blocks": [], "dst_blocks": [], "total_bytes": 1}, ValueError, ["0..0"]),
    ({"src_blocks": [], "dst_blocks": [], "total_bytes": -1}, ValueError, ["0..0"]),
    ({"src_blocks": [], "dst_blocks": [], "first": 5}, CapacityError, ["first=5", "n=4"]),
]  # fmt: skip
