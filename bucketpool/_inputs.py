"""Reading and checking a fill's inputs: the only place where a fill runs user code.

A fill runs in two phases.  Here the arguments are read -- an argument's ``__index__``, a
sequence's ``__len__``, ``__iter__`` and ``__getitem__``, a tensor's ``numpy()``, an ndarray
subclass's methods run here and only here -- and every value is checked, converted and (for
block copies) planned into runs.  The plans hold only Python ints and base-class
``numpy.ndarray`` objects (``np.asarray`` reads a subclass as a base-class view), so the
writer (`bucketpool._fill`), which runs numpy on a plan and its destination arrays only,
cannot call back into user code between the checks and the writes.  A plan's arrays may be
the caller's own where no conversion was needed, so they must not change before the plan is
written; the writer, which knows the destination, checks that a plan fits it and copies an
input that may share memory with it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NoReturn, SupportsIndex, final

import attrs
import numpy as np
import numpy.typing as npt
import torch

from bucketpool._types import IntArray, IntegerInput

__all__ = ["BlockPlan", "CopyPlan", "read_block_copies", "read_copies"]

_MAX_ADDRESS = (1 << 64) - 1
_ADDRESS_END = 1 << 64
_MAX_BYTES = (1 << 63) - 1
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}
# Below this, run planning packs a source and a destination block index into one int64.
_KEY_LIMIT = 1 << 31
_ACCEPTED = "a 1-D numpy integer array, a CPU integer tensor or a sequence of ints"
_OP = "add_copies"
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


# Plans are plain slots classes that attrs writes: one is built per fill, and a NamedTuple
# or an attrs.frozen class measured clearly slower to build. Treat them as read-only.
@final
@attrs.define(eq=False)
class CopyPlan:
    """What `read_copies` read: *k* checked copies to write from entry *first* on.

    The columns are 1-D base-class arrays in the destination columns' dtypes; *byte_counts*
    may instead be one int for every copy.  *first* is not checked against any length.
    """

    first: int
    k: int
    sources: IntArray
    destinations: IntArray
    byte_counts: IntArray | int


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


def read_copies(
    first: SupportsIndex,
    sources: IntegerInput,
    destinations: IntegerInput,
    byte_counts: IntegerInput | SupportsIndex,
    src_dtype: np.dtype[Any],
    dst_dtype: np.dtype[Any],
    size_dtype: np.dtype[Any],
) -> CopyPlan:
    """Read and check the arguments of `bucketpool._fill.add_copies` into a `CopyPlan`.

    Makes every check ``add_copies`` makes but the span's (*first* against the length,
    which the writer checks), raising the same errors with the same messages.  Thread-safe
    as far as the inputs are: no other thread may change them while they are read.

    Args:
        first: the first entry to write.
        sources: *k* source addresses, in any form ``add_copies`` takes.
        destinations: *k* destination addresses, likewise.
        byte_counts: *k* byte counts, likewise, or one integer for every copy.
        src_dtype: the source column's dtype (int64 or uint64), which *sources* is read into.
        dst_dtype: the destination column's dtype, which *destinations* is read into.
        size_dtype: the sizes column's dtype, which an array of byte counts is read into.

    Returns:
        The plan: ints and 1-D base-class arrays.

    Raises:
        TypeError: as ``add_copies`` raises it.
        ValueError: as ``add_copies`` raises it.
    """
    start = first if type(first) is int else _index(first, "first", _OP)
    # Fast path: a numpy array already in the destination dtype needs no conversion and no
    # check (every 64-bit pattern is a valid address). Identity of builtin dtypes is cheap.
    if type(sources) is np.ndarray and sources.dtype is src_dtype and sources.ndim == 1:
        src = sources
    else:
        src = _addresses(sources, "sources", src_dtype)
    if (
        type(destinations) is np.ndarray
        and destinations.dtype is dst_dtype
        and destinations.ndim == 1
    ):
        dst = destinations
    else:
        dst = _addresses(destinations, "destinations", dst_dtype)
    k = len(src)
    if len(dst) != k:
        raise ValueError(
            f"{_OP}: sources and destinations must have the same length, got {k} sources and "
            f"{len(dst)} destinations; pass one destination per source"
        )
    counts: IntArray | int
    if (
        type(byte_counts) is np.ndarray
        and byte_counts.dtype is size_dtype
        and byte_counts.ndim == 1
        and len(byte_counts) == k
    ):
        counts = byte_counts
        # One argmin finds negative counts and, through an int64 view, uint64 counts >= 2**63.
        # ndarray.argmin costs about a third of ndarray.min(), which goes through Python.
        signed = counts if size_dtype is _I64 else counts.view(_I64)
        if k and signed.item(signed.argmin()) < 0:
            _reject_byte_counts(counts, signed)
    elif type(byte_counts) is int or isinstance(byte_counts, (int, np.integer)):
        counts = _byte_count(byte_counts, "byte_counts", _OP)
    else:
        counts = _byte_counts(byte_counts, size_dtype)
        if len(counts) != k:
            raise ValueError(
                f"{_OP}: byte_counts must have one entry per copy: got {len(counts)} byte "
                f"counts for {k} sources; pass {k} counts or one integer for every copy"
            )
    return CopyPlan(start, k, src, dst, counts)


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
    return start, src_start, dst_start, step


def _read_block_lists(src_blocks: object, dst_blocks: object) -> tuple[IntArray, IntArray]:
    """Return both block lists as 1-D integer arrays of one length (values not checked)."""
    # The common input, 1-D native int64 arrays, skips _to_array.
    if type(src_blocks) is np.ndarray and src_blocks.dtype is _I64 and src_blocks.ndim == 1:
        src_idx: IntArray = src_blocks
    else:
        src_idx = _to_array(src_blocks, "src_blocks")
    if type(dst_blocks) is np.ndarray and dst_blocks.dtype is _I64 and dst_blocks.ndim == 1:
        dst_idx: IntArray = dst_blocks
    else:
        dst_idx = _to_array(dst_blocks, "dst_blocks")
    if len(dst_idx) != len(src_idx):
        raise ValueError(
            f"{_BLOCK_OP}: src_blocks and dst_blocks must have the same length, got "
            f"{len(src_idx)} source blocks and {len(dst_idx)} destination blocks; pass one "
            "destination block per source block"
        )
    return src_idx, dst_idx


def _read_trim(total_bytes: SupportsIndex, count: int, step: int) -> int:
    """Return what the last copy loses for *total_bytes* to move in all, checking its range."""
    total = _index(total_bytes, "total_bytes", _BLOCK_OP)
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
        src_reach > _MAX_BYTES
        or dst_reach > _MAX_BYTES
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


def _address(value: int, name: str, op: str) -> None:
    if not 0 <= value <= _MAX_ADDRESS:
        raise ValueError(f"{op}: {name} must be an address in 0..2**64-1, got {name}={value}")


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
            arr = np.asarray(values.numpy())  # base class even if a subclass overrides numpy()
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
    items = list(values)  # read once, so that what is checked is what is converted
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"{name} must hold integers, got {name}[{i}] = {value!r} ({type(value).__name__})"
            )
        if not 0 <= value <= _MAX_ADDRESS:
            raise ValueError(f"{name}[{i}] = {value} does not fit in 64 bits (0..2**64-1)")
    return np.array(items, dtype=np.uint64)


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


def _bits(address: int, target: np.dtype[Any]) -> int:
    """Return *address* as a Python int that fits *target* (its bit pattern for int64)."""
    if target.kind == "i" and address > _MAX_BYTES:
        return address - (1 << 64)
    return address
