"""Vectorised descriptor filling: the numpy work behind a handle's ``add_copies``."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from bucketpool._errors import CapacityError

__all__ = [
    "DescriptorArrays",
    "IntegerInput",
    "add_block_copies",
    "add_copies",
]

#: A 1-D numpy array of any integer dtype.
IntArray: TypeAlias = npt.NDArray[np.integer[Any]]
#: ``(src, dst, sizes)``: three 1-D int64 or uint64 arrays of one length, written in place.
DescriptorArrays: TypeAlias = tuple[IntArray, IntArray, IntArray]
#: What the fill functions accept for a column of values.
IntegerInput: TypeAlias = IntArray | torch.Tensor | Sequence[int]

_MAX_ADDRESS = (1 << 64) - 1
_ADDRESS_END = 1 << 64
_MAX_BYTES = (1 << 63) - 1
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_UNSIGNED: dict[int, np.dtype[np.unsignedinteger[Any]]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: _U64,
}
# Below this, add_block_copies packs a source and a destination block index into one int64.
_KEY_LIMIT = 1 << 31
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


_ONE = _operand(1)
_KEY_SHIFT = _operand(32)
_KEY_STEP = _operand((1 << 32) + 1)
_ACCEPTED = "a 1-D numpy integer array, a CPU integer tensor or a sequence of ints"


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
    src_arr, dst_arr, size_arr = arrays
    start = first if type(first) is int else _index(first, "first", "add_copies")
    src_type = src_arr.dtype
    # Fast path: a numpy array already in the destination dtype needs no conversion and no
    # check (every 64-bit pattern is a valid address). Identity of builtin dtypes is cheap.
    if type(sources) is np.ndarray and sources.dtype is src_type and sources.ndim == 1:
        src = sources
    else:
        src = _addresses(sources, "sources", src_type)
    dst_type = dst_arr.dtype
    if (
        type(destinations) is np.ndarray
        and destinations.dtype is dst_type
        and destinations.ndim == 1
    ):
        dst = destinations
    else:
        dst = _addresses(destinations, "destinations", dst_type)
    k = len(src)
    if len(dst) != k:
        raise ValueError(
            f"add_copies: sources and destinations must have the same length, got {k} sources and "
            f"{len(dst)} destinations; pass one destination per source"
        )
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
    counts: IntArray | int
    size_type = size_arr.dtype
    if (
        type(byte_counts) is np.ndarray
        and byte_counts.dtype is size_type
        and byte_counts.ndim == 1
        and len(byte_counts) == k
    ):
        counts = byte_counts
        # One argmin finds negative counts and, through an int64 view, uint64 counts >= 2**63.
        # ndarray.argmin costs about a third of ndarray.min(), which goes through Python.
        signed = counts if size_type is _I64 else counts.view(_I64)
        if k and signed[signed.argmin()] < 0:
            _reject_byte_counts(counts, signed)
        if (
            counts.base is not None
            or counts is src_arr
            or counts is dst_arr
            or src_arr.base is counts
            or dst_arr.base is counts
        ) and (_may_share_memory(counts, src_arr) or _may_share_memory(counts, dst_arr)):
            counts = counts.copy()  # read before the columns it may share are written
    elif type(byte_counts) is int or isinstance(byte_counts, (int, np.integer)):
        counts = _byte_count(byte_counts, "byte_counts", "add_copies")
    else:
        counts = _byte_counts(byte_counts, size_type)
        if len(counts) != k:
            raise ValueError(
                f"add_copies: byte_counts must have one entry per copy: got {len(counts)} "
                f"byte counts for {k} sources; pass {k} counts or one integer for every copy"
            )
        if _may_share_memory(counts, src_arr) or _may_share_memory(counts, dst_arr):
            counts = counts.copy()
    end = start + k
    if start < 0 or end > len(src_arr):
        _check_span("add_copies", start, k, len(src_arr), "copies")
    src_arr[start:end] = src
    dst_arr[start:end] = dst
    size_arr[start:end] = counts
    return end


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
    src_arr, dst_arr, size_arr = arrays
    op = "add_block_copies"
    start = first if type(first) is int else _index(first, "first", op)
    src_start = src_base if type(src_base) is int else _index(src_base, "src_base", op)
    dst_start = dst_base if type(dst_base) is int else _index(dst_base, "dst_base", op)
    if not (0 <= src_start <= _MAX_ADDRESS and 0 <= dst_start <= _MAX_ADDRESS):
        _address(src_start, "src_base", op)
        _address(dst_start, "dst_base", op)
    step = block_bytes if type(block_bytes) is int else _index(block_bytes, "block_bytes", op)
    if not 0 < step <= _MAX_BYTES:
        raise ValueError(
            f"{op}: block_bytes must be in 1..2**63-1, got block_bytes={step}; pass the size "
            "of one block in bytes"
        )
    # At 1,024 blocks a call costs its dozen numpy calls (0.25 us each before any work, and
    # 0.1-0.25 us of work) plus about 2 us of Python: the checks and steps below are the
    # ones with the fewest calls that measured fastest. The common input, 1-D native int64
    # arrays, skips _to_array.
    if type(src_blocks) is np.ndarray and src_blocks.dtype is _I64 and src_blocks.ndim == 1:
        src_idx: IntArray = src_blocks
    else:
        src_idx = _to_array(src_blocks, "src_blocks")
    if type(dst_blocks) is np.ndarray and dst_blocks.dtype is _I64 and dst_blocks.ndim == 1:
        dst_idx: IntArray = dst_blocks
    else:
        dst_idx = _to_array(dst_blocks, "dst_blocks")
    count = len(src_idx)
    if len(dst_idx) != count:
        raise ValueError(
            f"{op}: src_blocks and dst_blocks must have the same length, got {count} source blocks "
            f"and {len(dst_idx)} destination blocks; pass one destination block per source block"
        )
    trim = 0
    if total_bytes is not None:
        total = _index(total_bytes, "total_bytes", op)
        if total < 0 or not (count - 1) * step < total <= count * step:
            lowest = max(0, (count - 1) * step + 1)
            raise ValueError(
                f"{op}: total_bytes={total} does not fit {count} blocks of {step} bytes: it "
                f"must be in {lowest}..{count * step} (every block but the last is copied whole); "
                "pass None to copy whole blocks"
            )
        trim = count * step - total
    if count == 0:
        return _check_span(op, start, 0, len(src_arr), "descriptors")

    if src_idx.dtype is _I64 and dst_idx.dtype is _I64:
        src = src_idx
        dst = dst_idx
        # Each column's largest index through its unsigned view, where a negative one reads
        # as 2**63 or more (ndarray.argmax costs a third of .max()). Only when a limit is
        # exceeded do the checks that name the fault run.
        unsigned = src.view(_U64)
        src_top = unsigned.item(unsigned.argmax())
        unsigned = dst.view(_U64)
        dst_top = unsigned.item(unsigned.argmax())
        src_reach = (src_top + 1) * step
        dst_reach = (dst_top + 1) * step
        if (
            src_reach > _MAX_BYTES
            or dst_reach > _MAX_BYTES
            or src_start + src_reach > _ADDRESS_END
            or dst_start + dst_reach > _ADDRESS_END
        ):
            _check_blocks(src, "src_blocks", src_start, step)
            _check_blocks(dst, "dst_blocks", dst_start, step)
    else:
        src_top = _check_blocks(src_idx, "src_blocks", src_start, step)
        dst_top = _check_blocks(dst_idx, "dst_blocks", dst_start, step)
        src = _as_int64(src_idx)
        dst = _as_int64(dst_idx)
    # Every index is now in 0..2**63-1 and every offset (index * step) below 2**63, so int64
    # holds them, and int64 arithmetic, which wraps mod 2**64, gives the addresses' bits.

    runs = count
    key = None
    if coalesce and count > 1:
        # breaks[i] is True where block i + 1 starts a new run: not both indices step by one.
        if src_top < _KEY_LIMIT and dst_top < _KEY_LIMIT:
            # key = src * 2**32 + dst packs both indices into one int64, and both step by
            # one exactly where the key steps by 2**32 + 1 (below 2**31, the low half can
            # neither borrow from nor carry into the high half): four ufunc calls where
            # testing the columns apart takes five.
            key = np.left_shift(src, _KEY_SHIFT)
            np.bitwise_or(key, dst, key)
            breaks = (key[1:] - key[:-1]) != _KEY_STEP
        else:
            breaks = (src[1:] - src[:-1]) != _ONE
            breaks |= (dst[1:] - dst[:-1]) != _ONE
        # No run merges (the common shuffled case) when even the smallest entry is True:
        # argmin and item cost 0.2 us, count_nonzero 0.35 us, so it runs only otherwise.
        if not breaks.item(breaks.argmin()):
            runs = 1 + int(np.count_nonzero(breaks))
    end = start + runs
    if start < 0 or end > len(src_arr):
        _check_span(op, start, runs, len(src_arr), "descriptors")

    # Everything is checked: from here on nothing raises. Each input is read before an
    # output it might share memory with is written (the caller may pass any arrays).
    if runs == 1:
        # One descriptor (one block, or all consecutive): scalar writes beat ufunc calls.
        src_address = _bits(src_start + int(src[0]) * step, src_arr.dtype)
        dst_address = _bits(dst_start + int(dst[0]) * step, dst_arr.dtype)
        src_arr[start] = src_address
        dst_arr[start] = dst_address
        size_arr[start] = count * step - trim
        return end
    scale = _operand(step)
    if runs == count:
        src_firsts = src
        # Scaled ahead of the writes (into the spent key, when there is one), as dst may
        # share memory with the entries that take the source addresses.
        dst_offsets = np.multiply(dst, scale, key)
    else:
        firsts = np.empty(runs, dtype=np.intp)
        firsts[0] = 0
        np.add(breaks.nonzero()[0], 1, out=firsts[1:])
        src_firsts = src[firsts]
        dst_offsets = dst[firsts]
        dst_offsets *= scale
    # Straight into the output, in its own dtype: mixed-dtype loops cost twice as much.
    src_out = src_arr[start:end]
    if src_out.dtype is _I64:
        np.multiply(src_firsts, scale, src_out)
        np.add(src_out, _operand(src_start), src_out)
    else:
        _write_addresses(src_out, src_firsts, scale, src_start)
    dst_out = dst_arr[start:end]
    if dst_out.dtype is _I64:
        np.add(dst_offsets, _operand(dst_start), dst_out)
    else:
        _write_addresses(dst_out, dst_offsets, None, dst_start)
    size_out = size_arr[start:end]
    if runs == count:
        size_out.fill(step)
        last = step
    else:
        np.subtract(firsts[1:], firsts[:-1], out=size_out[:-1], casting="unsafe")
        size_out[-1] = count - firsts[-1]
        size_out *= step
        last = int(size_out[-1])
    if trim:
        size_out[-1] = last - trim
    return end


def _index(value: object, name: str, op: str) -> int:
    """Return *value* as an int: anything `operator.index` takes (numpy integers), not bools."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{op}: {name} must be an integer, not bool ({name}={value!r}); pass an int"
        )
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{op}: {name} must be an integer, not {type(value).__name__} ({name}={value!r}); "
            "pass an int or a numpy integer"
        ) from None


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


def _address(value: object, name: str, op: str) -> int:
    address = value if type(value) is int else _index(value, name, op)
    if not 0 <= address <= _MAX_ADDRESS:
        raise ValueError(f"{op}: {name} must be an address in 0..2**64-1, got {name}={address}")
    return address


def _byte_count(value: object, name: str, op: str) -> int:
    count = value if type(value) is int else _index(value, name, op)
    if not 0 <= count <= _MAX_BYTES:
        raise ValueError(f"{op}: {name} must be a byte count in 0..2**63-1, got {name}={count}")
    return count


def _describe(values: object) -> str:
    if isinstance(values, np.ndarray):
        return f"a numpy array of dtype {values.dtype}"
    if isinstance(values, torch.Tensor):
        return f"a tensor of dtype {values.dtype}"
    return f"{type(values).__name__} {values!r:.60}"


def _to_array(values: object, name: str) -> IntArray:
    """Return *values* as a 1-D native-endian integer array, checking Python ints' range."""
    if type(values) is np.ndarray and values.ndim == 1:
        dtype = values.dtype
        if dtype.kind in "iu" and dtype.isnative:
            return values
    from_python = False
    if isinstance(values, np.ndarray):
        arr: npt.NDArray[Any] = np.asarray(values)  # a subclass, or a 0-d / 2-D array
    elif isinstance(values, torch.Tensor):
        if not values.is_cpu:
            raise TypeError(
                f"{name} is a tensor on {values.device}; descriptors are filled on the host, "
                f"so move it to the CPU first ({name}.cpu())"
            )
        try:
            arr = values.numpy()
        except (TypeError, RuntimeError) as exc:
            raise TypeError(f"{name} must hold integers, got {_describe(values)}: {exc}") from None
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes, bytearray)):
        from_python = True
        try:
            arr = np.asarray(values)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}") from None
        if arr.dtype.kind in "fO" and arr.ndim == 1:
            # numpy reads a list mixing ints >= 2**63 with other ints as float64 (inexact),
            # and ints beyond 64 bits as objects: read such lists exactly, or reject them.
            arr = _python_ints(values, name)
    else:
        raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {_describe(arr)}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if from_python and arr.dtype.kind == "i":
        _check_non_negative(arr, name)
    return arr


def _python_ints(values: Sequence[object], name: str) -> npt.NDArray[np.uint64]:
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"{name} must hold integers, got {name}[{i}] = {value!r} ({type(value).__name__})"
            )
        if not 0 <= value <= _MAX_ADDRESS:
            raise ValueError(f"{name}[{i}] = {value} does not fit in 64 bits (0..2**64-1)")
    return np.array(values, dtype=np.uint64)


def _check_non_negative(arr: IntArray, name: str) -> None:
    if len(arr) and arr[arr.argmin()] < 0:
        i = int(arr.argmin())
        raise ValueError(f"{name}[{i}] = {arr[i]} is negative; {name} must be >= 0")


def _addresses(values: object, name: str, target: np.dtype[Any]) -> IntArray:
    arr = _to_array(values, name)
    if arr.dtype.itemsize == 8:
        # int64 input is taken as a bit pattern; a view reinterprets it for free.
        return arr if arr.dtype == target else arr.view(target)
    if arr.dtype.kind == "i":
        _check_non_negative(arr, name)
    return arr.astype(target)


def _byte_counts(values: object, target: np.dtype[Any]) -> IntArray:
    arr = _to_array(values, "byte_counts")
    if len(arr) == 0:
        return arr
    signed = arr if arr.dtype.kind == "i" or arr.dtype.itemsize < 8 else arr.view(_I64)
    if signed[signed.argmin()] < 0:
        _reject_byte_counts(arr, signed)
    if arr.dtype.itemsize == 8:
        return arr if arr.dtype == target else arr.view(target)
    return arr.astype(target)


def _reject_byte_counts(arr: IntArray, signed: IntArray) -> NoReturn:
    i = int(signed.argmin())
    raise ValueError(
        f"byte_counts[{i}] = {arr[i]} is outside 0..2**63-1; byte counts must be >= 0 and "
        "below 2**63"
    )


def _check_blocks(indices: IntArray, name: str, base: int, step: int) -> int:
    """Check that block *indices* are >= 0 and that their region fits the address space.

    Returns the largest index.
    """
    dtype = indices.dtype
    unsigned = indices if dtype.kind == "u" else indices.view(_UNSIGNED[dtype.itemsize])
    # Negative indices read as unsigned are at least 2**(bits-1): one argmax finds them too.
    top = int(unsigned[unsigned.argmax()])
    if dtype.kind == "i" and top >> (8 * dtype.itemsize - 1):
        _check_non_negative(indices, name)
    extent = (top + 1) * step
    if extent > _MAX_BYTES:
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


def _bits(address: int, target: np.dtype[Any]) -> int:
    """Return *address* as a Python int that fits *target* (its bit pattern for int64)."""
    if target.kind == "i" and address > _MAX_BYTES:
        return address - (1 << 64)
    return address
