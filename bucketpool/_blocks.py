"""Reading, checking and planning block copies: the first phase of ``add_block_copies``.

The two-phase design is explained in `bucketpool._inputs`, whose helpers read every argument
here (so that user code runs there only); this module checks the block lists against their
regions and plans the runs of consecutive blocks into a `BlockPlan` for `bucketpool._fill`.
"""

from __future__ import annotations

from typing import Any, SupportsIndex, final

import attrs
import numpy as np
import numpy.typing as npt

from bucketpool._inputs import (
    MAX_ADDRESS,
    MAX_BYTES,
    as_integer,
    check_address,
    check_non_negative,
    to_array,
)
from bucketpool._types import IntArray, IntegerInput

__all__ = ["BlockPlan", "read_block_copies"]

_ADDRESS_END = 1 << 64
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}
# Below this, run planning packs a source and a destination block index into one int64.
_KEY_LIMIT = 1 << 31
_BLOCK_OP = "add_block_copies"


def _constant(value: int) -> npt.NDArray[np.int64]:
    # A ufunc takes a 0-d array of its operand's dtype faster than a Python int, which it
    # converts first. Read-only, so that threads may share it.
    constant = np.array(value, dtype=np.int64)
    constant.flags.writeable = False
    return constant


_ONE = _constant(1)
_KEY_SHIFT = _constant(32)
_KEY_STEP = _constant((1 << 32) + 1)


# Like `bucketpool._inputs.CopyPlan`, a plain slots class that attrs writes: one is built per
# fill, and a NamedTuple or an attrs.frozen class measured clearly slower to build. Treat it
# as read-only.
@final
@attrs.define(eq=False)
class BlockPlan:
    """What `read_block_copies` read and planned: *runs* descriptors from entry *first* on.

    The block lists hold the *blocks* checked indices, as 1-D base-class int64 arrays, every
    offset ``index * block_bytes`` below 2**63.  *run_starts* holds each run's first block
    where runs merged (``1 < runs < blocks``); *single* is the one descriptor, in the
    columns' form, where ``runs == 1``; *scratch* is an int64 array of *blocks* entries that
    the writer may overwrite.  *trim* is what *total_bytes* takes off the last descriptor.
    """

    first: int
    runs: int
    blocks: int
    src_base: int
    dst_base: int
    block_bytes: int
    trim: int
    src_blocks: IntArray
    dst_blocks: IntArray
    run_starts: npt.NDArray[np.intp] | None
    single: tuple[int, int, int] | None
    scratch: IntArray | None


def read_block_copies(
    first: SupportsIndex,
    src_base: SupportsIndex,
    dst_base: SupportsIndex,
    src_blocks: IntegerInput,
    dst_blocks: IntegerInput,
    block_bytes: SupportsIndex,
    *,
    total_bytes: SupportsIndex | None = None,
    coalesce: bool = True,
    src_dtype: np.dtype[Any],
    dst_dtype: np.dtype[Any],
) -> BlockPlan:
    """Read and check the arguments of `bucketpool._fill.add_block_copies`; plan the runs.

    Makes every check ``add_block_copies`` makes but the span's (whether the descriptors fit
    after *first*, which the writer checks), raising the same errors with the same messages,
    and finds the runs of consecutive blocks (with *coalesce*), so that the plan tells how
    many descriptors will be written.  Thread-safe as far as the inputs are.

    Args:
        first: the first entry to write.
        src_base: address of source block 0, 0..2**64-1.
        dst_base: address of destination block 0, 0..2**64-1.
        src_blocks: source block indices (>= 0), in any form ``add_block_copies`` takes.
        dst_blocks: destination block indices (>= 0), as many as *src_blocks*.
        block_bytes: bytes per block, > 0.
        total_bytes: when given, the bytes to move in all; the last copy is trimmed to fit.
        coalesce: merge runs of consecutive blocks into one descriptor each.
        src_dtype: the source column's dtype (int64 or uint64), for a single descriptor.
        dst_dtype: the destination column's dtype, likewise.

    Returns:
        The plan: ints, 1-D base-class arrays, and a single descriptor as a tuple of ints.

    Raises:
        TypeError: as ``add_block_copies`` raises it.
        ValueError: as ``add_block_copies`` raises it.
    """
    if not isinstance(coalesce, (bool, np.bool_)):  # a string or a count would read as true
        raise TypeError(f"add_block_copies: coalesce must be True or False, got {coalesce!r}")
    start, src_start, dst_start, step = _read_block_scalars(first, src_base, dst_base, block_bytes)
    src_idx, dst_idx = _read_block_lists(src_blocks, dst_blocks)
    count = len(src_idx)
    trim = 0 if total_bytes is None else _read_trim(total_bytes, count, step)
    if count == 0:
        empty = (_as_int64(src_idx), _as_int64(dst_idx))
        return BlockPlan(start, 0, 0, src_start, dst_start, step, 0, *empty, None, None, None)
    src, dst, src_top, dst_top = _check_ranges(src_idx, dst_idx, src_start, dst_start, step)
    runs, run_starts, scratch = count, None, None
    if coalesce and count > 1:
        small = src_top < _KEY_LIMIT and dst_top < _KEY_LIMIT
        runs, run_starts, scratch = _plan_runs(src, dst, small)
    single = None
    if runs == 1:  # one block, or all consecutive: the writer stores three ints
        src_address = src_start + int(src[0]) * step
        dst_address = dst_start + int(dst[0]) * step
        single = (_bits(src_address, src_dtype), _bits(dst_address, dst_dtype), count * step - trim)
    return BlockPlan(
        start, runs, count, src_start, dst_start, step, trim, src, dst, run_starts, single, scratch
    )


def _read_block_scalars(
    first: SupportsIndex,
    src_base: SupportsIndex,
    dst_base: SupportsIndex,
    block_bytes: SupportsIndex,
) -> tuple[int, int, int, int]:
    """Return *first*, the bases and the block size as ints, checking the bases and size."""
    op = _BLOCK_OP
    start = first if type(first) is int else as_integer(first, "first", op)
    src_start = src_base if type(src_base) is int else as_integer(src_base, "src_base", op)
    dst_start = dst_base if type(dst_base) is int else as_integer(dst_base, "dst_base", op)
    if not (0 <= src_start <= MAX_ADDRESS and 0 <= dst_start <= MAX_ADDRESS):
        check_address(src_start, "src_base", op)
        check_address(dst_start, "dst_base", op)
    step = block_bytes if type(block_bytes) is int else as_integer(block_bytes, "block_bytes", op)
    if not 0 < step <= MAX_BYTES:
        raise ValueError(
            f"{op}: block_bytes must be in 1..2**63-1, got block_bytes={step}; pass the size "
            "of one block in bytes"
        )
    return start, src_start, dst_start, step


def _read_block_lists(src_blocks: object, dst_blocks: object) -> tuple[IntArray, IntArray]:
    """Return both block lists as 1-D integer arrays of one length (values not checked)."""
    # The common input, 1-D native int64 arrays, skips _to_array.
    if type(src_blocks) is np.ndarray and src_blocks.dtype is _I64 and src_blocks.ndim == 1:
        src_idx: IntArray = src_blocks
    else:
        src_idx = to_array(src_blocks, "src_blocks")
    if type(dst_blocks) is np.ndarray and dst_blocks.dtype is _I64 and dst_blocks.ndim == 1:
        dst_idx: IntArray = dst_blocks
    else:
        dst_idx = to_array(dst_blocks, "dst_blocks")
    if len(dst_idx) != len(src_idx):
        raise ValueError(
            f"{_BLOCK_OP}: src_blocks and dst_blocks must have the same length, got "
            f"{len(src_idx)} source blocks and {len(dst_idx)} destination blocks; pass one "
            "destination block per source block"
        )
    return src_idx, dst_idx


def _read_trim(total_bytes: SupportsIndex, count: int, step: int) -> int:
    """Return what the last copy loses for *total_bytes* to move in all, checking its range."""
    total = as_integer(total_bytes, "total_bytes", _BLOCK_OP)
    if total < 0 or not (count - 1) * step < total <= count * step:
        lowest = max(0, (count - 1) * step + 1)
        raise ValueError(
            f"{_BLOCK_OP}: total_bytes={total} does not fit {count} blocks of {step} bytes: it "
            f"must be in {lowest}..{count * step} (every block but the last is copied whole); "
            "pass None to copy whole blocks"
        )
    return count * step - total


def _check_ranges(
    src_idx: IntArray, dst_idx: IntArray, src_start: int, dst_start: int, step: int
) -> tuple[IntArray, IntArray, int, int]:
    """Check both block lists against their regions; return them as int64 and their largest.

    Afterwards every index is in 0..2**63-1 and every offset (index * step) below 2**63, so
    int64 holds them, and int64 arithmetic, which wraps mod 2**64, gives the addresses' bits.
    """
    if src_idx.dtype is not _I64 or dst_idx.dtype is not _I64:
        src_top = _check_blocks(src_idx, "src_blocks", src_start, step)
        dst_top = _check_blocks(dst_idx, "dst_blocks", dst_start, step)
        return _as_int64(src_idx), _as_int64(dst_idx), src_top, dst_top
    # Each column's largest index through its unsigned view, where a negative one reads as
    # 2**63 or more (ndarray.argmax costs a third of .max()). Only when a limit is exceeded
    # do the checks that name the fault run.
    unsigned = src_idx.view(_U64)
    src_top = unsigned.item(unsigned.argmax())
    unsigned = dst_idx.view(_U64)
    dst_top = unsigned.item(unsigned.argmax())
    src_reach = (src_top + 1) * step
    dst_reach = (dst_top + 1) * step
    if (
        src_reach > MAX_BYTES
        or dst_reach > MAX_BYTES
        or src_start + src_reach > _ADDRESS_END
        or dst_start + dst_reach > _ADDRESS_END
    ):
        _check_blocks(src_idx, "src_blocks", src_start, step)
        _check_blocks(dst_idx, "dst_blocks", dst_start, step)
    return src_idx, dst_idx, src_top, dst_top


def _plan_runs(
    src: IntArray, dst: IntArray, small: bool
) -> tuple[int, npt.NDArray[np.intp] | None, IntArray | None]:
    """Find the runs in two or more checked int64 block lists (*small*: all below 2**31).

    Returns the number of runs, each run's first block where runs merged (else None), and
    the spent run key, an array the writer may overwrite (else None).
    """
    # breaks[i] is True where block i + 1 starts a new run: not both indices step by one.
    key = None
    if small:
        # key = src * 2**32 + dst packs both indices into one int64, and both step by one
        # exactly where the key steps by 2**32 + 1 (below 2**31, the low half can neither
        # borrow from nor carry into the high half): four ufunc calls where testing the
        # columns apart takes five.
        key = np.left_shift(src, _KEY_SHIFT)
        np.bitwise_or(key, dst, key)
        breaks = (key[1:] - key[:-1]) != _KEY_STEP
    else:
        breaks = (src[1:] - src[:-1]) != _ONE
        breaks |= (dst[1:] - dst[:-1]) != _ONE
    # No run merges (the common shuffled case) when even the smallest entry is True:
    # argmin and item cost less than count_nonzero, so that runs only otherwise.
    if breaks.item(breaks.argmin()):
        return len(src), None, key
    runs = 1 + int(np.count_nonzero(breaks))
    if runs == 1:
        return 1, None, key
    starts = np.empty(runs, dtype=np.intp)
    starts[0] = 0
    np.add(breaks.nonzero()[0], 1, out=starts[1:])
    return runs, starts, key


def _check_blocks(indices: IntArray, name: str, base: int, step: int) -> int:
    """Check that block *indices* are >= 0 and that their region fits the address space.

    Returns the largest index.
    """
    dtype = indices.dtype
    unsigned = indices if dtype.kind == "u" else indices.view(_UNSIGNED[dtype.itemsize])
    # Negative indices read as unsigned are at least 2**(bits-1): one argmax finds them too.
    top = int(unsigned[unsigned.argmax()])
    if dtype.kind == "i" and top >> (8 * dtype.itemsize - 1):
        check_non_negative(indices, name)
    extent = (top + 1) * step
    if extent > MAX_BYTES:
        raise ValueError(
            f"{name} reaches block {top}, byte offset {extent} from its base; a block region "
            "must span less than 2**63 bytes"
        )
    if base + extent > _ADDRESS_END:
        raise ValueError(
            f"{name} reaches block {top}, which ends at {base + extent}, past the 64-bit "
            f"address space (base {base}, {step} bytes per block)"
        )
    return top


def _as_int64(indices: IntArray) -> npt.NDArray[np.int64]:
    """Checked block indices (all below 2**63) as int64: a view of 64-bit ones, else a copy."""
    if indices.dtype.itemsize == 8:
        return indices.view(_I64)
    return indices.astype(_I64)


def _bits(address: int, target: np.dtype[Any]) -> int:
    """Return *address* as a Python int that fits *target* (its bit pattern for int64)."""
    if target.kind == "i" and address > MAX_BYTES:
        return address - (1 << 64)
    return address
