"""Vectorised descriptor filling: the numpy work behind a handle's ``add_copies``."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NoReturn, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

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
_ONE = {"i": np.array(1, dtype=np.int64), "u": np.array(1, dtype=np.uint64)}
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

    Every argument is checked before the first entry is written, so a call that raises leaves
    *arrays* as they were. Not thread-safe: calls writing the same arrays must not overlap.

    Args:
        arrays: the destination ``(src, dst, sizes)`` arrays, 1-D, int64 or uint64.
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
        IndexError: *first* is negative, or ``first + k`` is beyond the arrays' length.
        TypeError: *first* or a scalar is not an integer (or is a bool); a column is not
            integers (floats, bools, strings, objects) or is a tensor not on the CPU.
        ValueError: a column is not 1-D; the lengths differ; an address is outside
            0..2**64-1; a byte count is outside 0..2**63-1.

    """
    src_arr, dst_arr, size_arr = arrays
    start = first if type(first) is int else _index(first, "first")
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
            f"sources and destinations must have the same length, got {k} sources and "
            f"{len(dst)} destinations; pass one destination per source"
        )
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
    elif type(byte_counts) is int or isinstance(byte_counts, (int, np.integer)):
        counts = _byte_count(byte_counts, "byte_counts")
    else:
        counts = _byte_counts(byte_counts, size_type)
        if len(counts) != k:
            raise ValueError(
                f"byte_counts must have one entry per copy: got {len(counts)} byte counts for "
                f"{k} sources; pass {k} counts or one integer for every copy"
            )
    end = _check_span(start, k, len(src_arr), "copies")
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

    Every argument is checked before the first entry is written, so a call that raises leaves
    *arrays* as they were. Not thread-safe: calls writing the same arrays must not overlap.

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
        IndexError: *first* is negative, or the descriptors do not fit after *first*.
        TypeError: a scalar is not an integer (or is a bool); a block list is not integers or
            is a tensor not on the CPU.
        ValueError: a block list is not 1-D or the lengths differ; a block index is negative;
            *block_bytes* is not positive; *total_bytes* is outside its range; a base is
            outside 0..2**64-1, or a region would end past 2**64 or span 2**63 bytes or more.

    """
    src_arr, dst_arr, size_arr = arrays
    start = first if type(first) is int else _index(first, "first")
    src_start = src_base if type(src_base) is int else _index(src_base, "src_base")
    dst_start = dst_base if type(dst_base) is int else _index(dst_base, "dst_base")
    if not (0 <= src_start <= _MAX_ADDRESS and 0 <= dst_start <= _MAX_ADDRESS):
        _address(src_start, "src_base")
        _address(dst_start, "dst_base")
    step = block_bytes if type(block_bytes) is int else _index(block_bytes, "block_bytes")
    if not 0 < step <= _MAX_BYTES:
        raise ValueError(f"block_bytes must be in 1..2**63-1, got {step}")
    src_idx = _to_array(src_blocks, "src_blocks")
    dst_idx = _to_array(dst_blocks, "dst_blocks")
    count = len(src_idx)
    if len(dst_idx) != count:
        raise ValueError(
            f"src_blocks and dst_blocks must have the same length, got {count} source blocks "
            f"and {len(dst_idx)} destination blocks; pass one destination block per source block"
        )
    trim = 0
    if total_bytes is not None:
        total = _index(total_bytes, "total_bytes")
        if total < 0 or not (count - 1) * step < total <= count * step:
            lowest = max(0, (count - 1) * step + 1)
            raise ValueError(
                f"total_bytes={total} does not fit {count} blocks of {step} bytes: it must be "
                f"in {lowest}..{count * step} (every block but the last is copied whole); "
                "pass None to copy whole blocks"
            )
        trim = count * step - total
    if count == 0:
        return _check_span(start, 0, len(src_arr), "descriptors")
    src_type = src_arr.dtype
    dst_type = dst_arr.dtype
    # Both index columns go into one array, so that each ufunc call below serves both: at
    # these sizes a call costs more than the work it does. After the checks every address
    # fits in 64 bits, so int64 arithmetic wraps to exactly the addresses' bit patterns.
    work = src_type if src_type == dst_type else _U64
    both = np.concatenate((src_idx, dst_idx), dtype=work, casting="unsafe")
    # One argmax over the unsigned view checks both columns against the stricter limits (the
    # higher base): a negative index, or a uint64 one >= 2**63 cast to int64, reads as at
    # least 2**63 there. Only when that fails do the exact per-column checks run.
    unsigned = both.view(_U64)
    reach = (int(unsigned[unsigned.argmax()]) + 1) * step
    if reach > _MAX_BYTES or reach + max(src_start, dst_start) > _ADDRESS_END:
        _check_blocks(src_idx, "src_blocks", src_start, step)
        _check_blocks(dst_idx, "dst_blocks", dst_start, step)

    runs = count
    if coalesce and count > 1:
        # Block i starts a run unless both indices step by exactly one into it (a uint64
        # difference may wrap, but never to 1). In the differences of the joined columns,
        # steps[count - 1:] covers destination blocks 0..count-1, where entry 0 (across the
        # columns) is meaningless and becomes the first run's start.
        steps = (both[1:] - both[:-1]) != _ONE[work.kind]
        starts_mask = steps[count - 1 :]
        starts_mask[0] = True
        starts_mask[1:] |= steps[: count - 1]
        # count_nonzero is cheap and spares nonzero() when no run merges or all do.
        runs = int(np.count_nonzero(starts_mask))
    end = _check_span(start, runs, len(src_arr), "descriptors")

    # Everything is checked: from here on nothing raises.
    if runs == 1:
        # One descriptor (one block, or all consecutive): scalar writes beat ufunc calls.
        src_arr[start] = _bits(src_start + int(both[0]) * step, src_type)
        dst_arr[start] = _bits(dst_start + int(both[count]) * step, dst_type)
        size_arr[start] = count * step - trim
        return end
    both *= step
    src_off = both[:count]
    dst_off = both[count:]
    size_out = size_arr[start:end]
    if runs == count:
        size_out[:] = step
        last = step
    else:
        starts = starts_mask.nonzero()[0]
        src_off = src_off[starts]
        dst_off = dst_off[starts]
        np.subtract(starts[1:], starts[:-1], out=size_out[:-1], casting="unsafe")
        size_out[-1] = count - int(starts[-1])
        size_out *= step
        last = int(size_out[-1])
    # "unsafe" only matters when one array is int64 and the other uint64: it keeps the bits.
    np.add(src_off, _bits(src_start, work), out=src_arr[start:end], casting="unsafe")
    np.add(dst_off, _bits(dst_start, work), out=dst_arr[start:end], casting="unsafe")
    if trim:
        size_out[-1] = last - trim
    return end


def _index(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not bool ({value!r})")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, not {type(value).__name__} ({value!r})"
        ) from None


def _check_span(first: int, k: int, n: int, what: str) -> int:
    if first < 0:
        raise IndexError(f"first must be >= 0, got first={first}")
    end = first + k
    if end > n:
        raise IndexError(
            f"{k} {what} starting at first={first} need entries up to {end}, but the buffers "
            f"hold n={n}; acquire at least {end} entries or split the batch"
        )
    return end


def _address(value: object, name: str) -> int:
    address = value if type(value) is int else _index(value, name)
    if not 0 <= address <= _MAX_ADDRESS:
        raise ValueError(f"{name} must be an address in 0..2**64-1, got {address}")
    return address


def _byte_count(value: object, name: str) -> int:
    count = _index(value, name)
    if not 0 <= count <= _MAX_BYTES:
        raise ValueError(f"{name} must be a byte count in 0..2**63-1, got {count}")
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


def _check_blocks(indices: IntArray, name: str, base: int, step: int) -> None:
    """Check that block *indices* are >= 0 and that their region fits the address space."""
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


def _bits(address: int, target: np.dtype[Any]) -> int:
    """Return *address* as a Python int that fits *target* (its bit pattern for int64)."""
    if target.kind == "i" and address > _MAX_BYTES:
        return address - (1 << 64)
    return address
