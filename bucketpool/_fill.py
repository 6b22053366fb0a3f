"""Writing descriptors: the numpy work behind a handle's ``add_copies``, and nothing else.

A fill reads and checks its inputs first (`bucketpool._inputs`, where all user code runs)
into a plan of Python ints and base-class arrays, and then writes it here: these functions
run numpy on a plan's arrays and the destination arrays only, so that nothing can run
between the checks and the writes.  The writers check what only they can, that the plan
fits the destination, and copy an input that may share memory with a column before that
column is written, so that the result is as if every input were read before the first write.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import SupportsIndex

import numpy as np
import numpy.typing as npt

from bucketpool._blocks import BlockPlan, read_block_copies
from bucketpool._errors import CapacityError
from bucketpool._inputs import CopyPlan, read_copies
from bucketpool._types import DescriptorArrays, IntArray, IntegerInput

__all__ = [
    "DescriptorArrays",
    "IntArray",
    "IntegerInput",
    "add_block_copies",
    "add_copies",
    "plan_block_copies",
    "plan_copies",
    "write_block_copies",
    "write_copies",
]

_MAX_BYTES = (1 << 63) - 1
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
# The C function itself where numpy exposes it: np.may_share_memory first goes through
# __array_function__ dispatch, which doubles the cost of this bounds test.
_may_share_memory: Callable[[IntArray, IntArray], bool] = getattr(
    np.may_share_memory, "_implementation", np.may_share_memory
)


@functools.lru_cache(maxsize=256)
def _operand(value: int) -> npt.NDArray[np.int64]:
    """Return *value*, a byte count or an address, as a read-only 0-d int64 array (its bits).

    A ufunc takes a 0-d array of its operand's dtype about 0.2 us faster than a Python int,
    which it converts first; bases and block sizes repeat from call to call, and a cache hit
    costs 0.05 us where a new array costs 0.17 us. Read-only, so that threads may share it.
    """
    operand = np.array(value - (1 << 64) if value > _MAX_BYTES else value, dtype=np.int64)
    operand.flags.writeable = False
    return operand


def add_copies(
    arrays: DescriptorArrays,
    first: SupportsIndex,
    sources: IntegerInput,
    destinations: IntegerInput,
    byte_counts: IntegerInput | SupportsIndex,
) -> int:
    """Write *k* copies into entries ``[first, first + k)`` of *arrays*.

    Copy *i* moves ``byte_counts[i]`` bytes from address ``sources[i]`` to address
    ``destinations[i]``. Addresses are 0..2**64-1: a uint64 array stores them exactly and an
    int64 array stores their two's-complement bit pattern (reading it back as uint64 gives the
    address). Values in numpy int64 arrays and int64 tensors are already in that form and are
    taken as bit patterns, so a negative value there is an address at or above 2**63; Python
    ints and narrower signed dtypes must be non-negative. Byte counts are 0..2**63-1.

    Integer arguments (*first*, a scalar *byte_counts*) take anything `operator.index` takes,
    numpy integers included, but not bools. Every argument is checked before the first entry
    is written, so a call that raises leaves *arrays* as they were. The inputs may share
    memory with *arrays* (their own columns, say, to swap the directions): the result is as
    if every input were read before the first write. Not thread-safe: calls writing the same
    arrays must not overlap.

    Args:
        arrays: the destination ``(src, dst, sizes)`` arrays, 1-D, int64 or uint64. They must
            not reach the memory of an input array that owns it other than as numpy views of
            it (``torch.from_numpy(input).numpy()`` would); a pool's arrays are its own.
        first: the first entry to write, ``0 <= first <= len(arrays[0])``.
        sources: *k* source addresses: a 1-D numpy integer array, a CPU integer tensor or a
            sequence of ints. A numpy array whose dtype equals the destination's is written
            without conversion (the fast path).
        destinations: *k* destination addresses, in any form *sources* accepts.
        byte_counts: *k* byte counts in any form *sources* accepts, or one integer used for
            every copy.

    Returns:
        ``first + k``, the next free entry, so that calls can be chained.

    Raises:
        CapacityError: ``first + k`` is beyond the arrays' length *n* (an `IndexError` and
            a `ValueError`); the message names *first*, *k* and *n*.
        IndexError: *first* is negative.
        TypeError: *first* or a scalar is not an integer (or is a bool); a column is not
            integers (floats, bools, strings, objects) or is a tensor not on the CPU.
        ValueError: a column is not 1-D; the lengths differ; an address is outside
            0..2**64-1; a byte count is outside 0..2**63-1.

    """
    plan = plan_copies(arrays, first, sources, destinations, byte_counts)
    return write_copies(arrays, len(arrays[0]), plan)


def add_block_copies(
    arrays: DescriptorArrays,
    first: SupportsIndex,
    src_base: SupportsIndex,
    dst_base: SupportsIndex,
    src_blocks: IntegerInput,
    dst_blocks: IntegerInput,
    block_bytes: SupportsIndex,
    *,
    total_bytes: SupportsIndex | None = None,
    coalesce: bool = True,
) -> int:
    """Write copies of whole blocks between two block-structured regions.

    Block copy *i* moves *block_bytes* bytes from ``src_base + src_blocks[i] * block_bytes``
    to ``dst_base + dst_blocks[i] * block_bytes``. With *coalesce*, each run of block copies
    whose source and destination indices both step by one becomes a single descriptor of
    ``run_length * block_bytes`` bytes: 1,024 consecutive blocks need one descriptor,
    1,024 shuffled ones need 1,024. Addresses are computed exactly, bases at or above 2**63
    included, and stored as in `add_copies`: as values in uint64 arrays and as bit patterns
    in int64 arrays. Block indices are values, never bit patterns: they must be >= 0.

    Integer arguments (*first*, the bases, *block_bytes*, *total_bytes*) take anything
    `operator.index` takes, numpy integers included, but not bools. Every argument is checked
    before the first entry is written, so a call that raises leaves *arrays* as they were.
    The block lists may share memory with *arrays*: the result is as
    if both were read before the first write. Not thread-safe: calls writing the same arrays
    must not overlap.

    Args:
        arrays: the destination ``(src, dst, sizes)`` arrays, 1-D, int64 or uint64.
        first: the first entry to write, ``0 <= first <= len(arrays[0])``.
        src_base: address of source block 0, 0..2**64-1.
        dst_base: address of destination block 0, 0..2**64-1.
        src_blocks: source block indices (>= 0), in any form `add_copies` accepts for
            addresses.
        dst_blocks: destination block indices (>= 0), as many as *src_blocks*.
        block_bytes: bytes per block, > 0.
        total_bytes: when given, the bytes to move in all; the last copy is trimmed to fit.
            With *count* blocks it must satisfy
            ``(count - 1) * block_bytes < total_bytes <= count * block_bytes``
            (0 when there are no blocks).
        coalesce: merge runs of consecutive blocks into one descriptor each.

    Returns:
        The next free entry: *first* plus the number of descriptors written.

    Raises:
        CapacityError: the descriptors do not fit after *first* (an `IndexError` and a
            `ValueError`); the message names *first*, the number of descriptors and *n*.
        IndexError: *first* is negative.
        TypeError: a scalar is not an integer (or is a bool); a block list is not integers or
            is a tensor not on the CPU.
        ValueError: a block list is not 1-D or the lengths differ; a block index is negative;
            *block_bytes* is not positive; *total_bytes* is outside its range; a base is
            outside 0..2**64-1, or a region would end past 2**64 or span 2**63 bytes or more.

    """
    plan = plan_block_copies(
        arrays,
        first,
        src_base,
        dst_base,
        src_blocks,
        dst_blocks,
        block_bytes,
        total_bytes,
        coalesce,
    )
    return write_block_copies(arrays, len(arrays[0]), plan)


def plan_copies(
    arrays: DescriptorArrays,
    first: SupportsIndex,
    sources: IntegerInput,
    destinations: IntegerInput,
    byte_counts: IntegerInput | SupportsIndex,
) -> CopyPlan:
    """`read_copies` for the dtypes of *arrays*: every input read (user code runs here)."""
    src, dst, sizes = arrays
    return read_copies(first, sources, destinations, byte_counts, src.dtype, dst.dtype, sizes.dtype)


def plan_block_copies(
    arrays: DescriptorArrays,
    first: SupportsIndex,
    src_base: SupportsIndex,
    dst_base: SupportsIndex,
    src_blocks: IntegerInput,
    dst_blocks: IntegerInput,
    block_bytes: SupportsIndex,
    total_bytes: SupportsIndex | None,
    coalesce: bool,
) -> BlockPlan:
    """`read_block_copies` for the dtypes of *arrays*, likewise."""
    return read_block_copies(
        *(first, src_base, dst_base, src_blocks, dst_blocks, block_bytes),
        total_bytes=total_bytes,
        coalesce=coalesce,
        src_dtype=arrays[0].dtype,
        dst_dtype=arrays[1].dtype,
    )


def write_copies(arrays: DescriptorArrays, n: int, plan: CopyPlan) -> int:
    """Write the *k* copies of *plan* into entries ``[first, first + k)`` of *arrays*.

    Checks that they fit in the first *n* entries, and writes nothing when they do not.
    The plan's arrays may share memory with *arrays*: the result is as if they were all read
    before the first write.  Calls no user code.  Not thread-safe: calls writing the same
    arrays must not overlap.

    Args:
        arrays: the destination ``(src, dst, sizes)`` arrays, 1-D, int64 or uint64.
        n: the entries that may be written, at most ``len(arrays[0])``.
        plan: what `bucketpool._inputs.read_copies` read for these arrays' dtypes.

    Returns:
        ``first + k``, the next free entry.

    Raises:
        CapacityError: ``first + k > n``, with the message `add_copies` gives.
        IndexError: *first* is negative.
    """
    first = plan.first
    k = plan.k
    end = first + k
    if first < 0 or end > n:
        _check_span("add_copies", first, k, n, "copies")
    src_arr, dst_arr, size_arr = arrays
    dst = plan.destinations
    counts = plan.byte_counts
    # As if every input were read before the first write: an input that may share memory
    # with a column written before it is read (the caller's own columns, say, to swap the
    # directions) is copied first; each slice assignment handles overlap with its own input.
    # An input that owns its memory (base None) can only overlap a column that is it or a
    # numpy view of it, as the columns never view memory that a caller's array owns (the
    # pool's are its own tensors); testing that first spares the costlier bounds test.
    if (dst.base is not None or dst is src_arr or src_arr.base is dst) and _may_share_memory(
        dst, src_arr
    ):
        dst = dst.copy()
    if (
        type(counts) is np.ndarray
        and (
            counts.base is not None
            or counts is src_arr
            or counts is dst_arr
            or src_arr.base is counts
            or dst_arr.base is counts
        )
        and (_may_share_memory(counts, src_arr) or _may_share_memory(counts, dst_arr))
    ):
        counts = counts.copy()
    src_arr[first:end] = plan.sources
    dst_arr[first:end] = dst
    size_arr[first:end] = counts
    return end


def write_block_copies(arrays: DescriptorArrays, n: int, plan: BlockPlan) -> int:
    """Write the descriptors of *plan* into entries ``[first, first + runs)`` of *arrays*.

    Checks that they fit in the first *n* entries, and writes nothing when they do not.
    The plan's block lists may share memory with *arrays*: the result is as if they were
    read before the first write.  Calls no user code.  Not thread-safe: calls writing the
    same arrays must not overlap.

    Args:
        arrays: the destination ``(src, dst, sizes)`` arrays, 1-D, int64 or uint64.
        n: the entries that may be written, at most ``len(arrays[0])``.
        plan: what `bucketpool._blocks.read_block_copies` read for these arrays' dtypes.

    Returns:
        ``first + runs``, the next free entry.

    Raises:
        CapacityError: the descriptors do not fit, with the message `add_block_copies` gives.
        IndexError: *first* is negative.
    """
    first = plan.first
    runs = plan.runs
    end = first + runs
    if first < 0 or end > n:
        _check_span("add_block_copies", first, runs, n, "descriptors")
    single = plan.single
    if single is not None:
        # One descriptor (one block, or all consecutive): scalar writes beat ufunc calls.
        arrays[0][first], arrays[1][first], arrays[2][first] = single
    elif runs:
        _write_runs(arrays, first, end, plan)
    return end


def _write_runs(arrays: DescriptorArrays, first: int, end: int, plan: BlockPlan) -> None:
    """Write two or more descriptors, one per run of *plan*, into entries ``[first, end)``."""
    src, dst, starts, step = plan.src_blocks, plan.dst_blocks, plan.run_starts, plan.block_bytes
    # Each input is read before an output that it may share memory with is written.
    scale = _operand(step)
    if starts is None:
        src_firsts = src
        # Scaled ahead of the writes (into the spent key, when there is one), as dst may
        # share memory with the entries that take the source addresses.
        dst_offsets = np.multiply(dst, scale, plan.scratch)
    else:
        src_firsts = src[starts]
        dst_offsets = dst[starts]
        dst_offsets *= scale
    # Straight into the output, in its own dtype: mixed-dtype loops cost twice as much.
    src_out = arrays[0][first:end]
    if src_out.dtype is _I64:
        np.multiply(src_firsts, scale, src_out)
        np.add(src_out, _operand(plan.src_base), src_out)
    else:
        _write_addresses(src_out, src_firsts, scale, plan.src_base)
    dst_out = arrays[1][first:end]
    if dst_out.dtype is _I64:
        np.add(dst_offsets, _operand(plan.dst_base), dst_out)
    else:
        _write_addresses(dst_out, dst_offsets, None, plan.dst_base)
    size_out = arrays[2][first:end]
    if starts is None:
        size_out.fill(step)
        last = step
    else:
        np.subtract(starts[1:], starts[:-1], out=size_out[:-1], casting="unsafe")
        size_out[-1] = plan.blocks - starts[-1]
        size_out *= step
        last = int(size_out[-1])
    if plan.trim:
        size_out[-1] = last - plan.trim


def _check_span(op: str, first: int, k: int, n: int, what: str) -> int:
    """Return ``first + k``, checking that entries ``[first, first + k)`` exist."""
    if first < 0:
        raise IndexError(f"{op}: first must be >= 0, got first={first}")
    end = first + k
    if end > n:
        raise CapacityError(
            f"{op}: k={k} {what} starting at first={first} need entries up to {end}, but the "
            f"buffers hold n={n}; nothing was written: acquire at least {end} entries, or "
            "split the batch"
        )
    return end


def _write_addresses(
    out: IntArray, values: IntArray, scale: npt.NDArray[np.int64] | None, base: int
) -> None:
    """Write ``base + values * scale`` (``base + values`` without *scale*) into *out*.

    For the columns that are not native int64. int64 arithmetic wraps mod 2**64, so it gives
    a uint64 column's bits as well: such a column is written through an int64 view, which
    spares the slower mixed-dtype loops. Another byte order is computed apart and converted.
    """
    dtype = out.dtype
    target = out.view(_I64) if dtype is _U64 else np.empty(len(out), dtype=_I64)
    if scale is not None:
        np.multiply(values, scale, target)
        values = target
    np.add(values, _operand(base), target)
    if dtype is not _U64:
        out[...] = target
