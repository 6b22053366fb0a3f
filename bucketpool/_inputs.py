"""A fill's inputs read and checked into a `Plan`: the only place a fill runs user code."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["MAX_ADDRESS", "MAX_BYTES", "Plan", "as_integer", "read_block_copies", "read_copies"]

MAX_ADDRESS = (1 << 64) - 1
MAX_BYTES = (1 << 63) - 1
IntArray = npt.NDArray[np.integer[Any]]
#: ``(first, k, sources, destinations, sizes)``: columns of the pool's dtype; sizes may be an int.
Plan = tuple[int, int, IntArray, IntArray, "IntArray | int"]

_I64, _U64 = np.dtype(np.int64), np.dtype(np.uint64)
_INT = frozenset((int,))
_ACCEPTED = "a 1-D numpy integer array, a CPU integer tensor or a sequence of ints"
_CONVERT = "pass an integer tensor or array (tensor.long(), array.astype(np.int64)) or ints"
_SUSPECT = frozenset((bool, np.bool_, np.ndarray))  # list items numpy may read as ints


def as_integer(value: object, name: str, op: str) -> int:
    """*value* as an int: anything `operator.index` takes (numpy integers), not bools."""
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


def read_copies(
    first: object, sources: object, destinations: object, byte_counts: object, dtype: np.dtype[Any]
) -> Plan:
    """Read and check `DescriptorBuffers.add_copies`' arguments (all but the span's checks)."""
    op = "add_copies"
    start = first if type(first) is int else as_integer(first, "first", op)
    src = _addresses(sources, "sources", dtype)
    dst = _addresses(destinations, "destinations", dtype)
    k = len(src)
    if len(dst) != k:
        raise ValueError(
            f"add_copies: sources and destinations must have the same length, got {k} sources "
            f"and {len(dst)} destinations; pass one destination per source"
        )
    if type(byte_counts) is int or isinstance(byte_counts, (int, np.integer)):
        count = (
            byte_counts if type(byte_counts) is int else as_integer(byte_counts, "byte_counts", op)
        )
        if not 0 <= count <= MAX_BYTES:
            raise ValueError(
                f"{op}: byte_counts must be a byte count in 0..2**63-1, got byte_counts={count}"
            )
        return start, k, src, dst, count
    counts = _to_array(byte_counts, "byte_counts")
    if len(counts) != k:
        raise ValueError(
            f"add_copies: byte_counts must have one entry per copy: got {len(counts)} byte "
            f"counts for {k} sources; pass {k} counts or one integer for every copy"
        )
    signed = counts if counts.dtype.kind == "i" or counts.itemsize < 8 else counts.view(_I64)
    if k and signed.item(signed.argmin()) < 0:
        i = int(signed.argmin())
        raise ValueError(
            f"byte_counts[{i}] = {counts[i]} is outside 0..2**63-1; byte counts must be >= 0 "
            "and below 2**63"
        )
    return start, k, src, dst, counts if counts.dtype == dtype else counts.astype(dtype)


def _addresses(values: object, name: str, dtype: np.dtype[Any]) -> IntArray:
    arr = _to_array(values, name)
    if arr.dtype.itemsize == 8:  # 64-bit input is taken as a bit pattern (narrower ones >= 0)
        return arr if arr.dtype is dtype else arr.view(dtype)
    if arr.dtype.kind == "i":
        _check_non_negative(arr, name)
    return arr.astype(dtype)


def _to_array(values: object, name: str) -> IntArray:
    """*values* as a 1-D native-endian integer array; Python ints are checked >= 0."""
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind in "iu":
        return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))
    if type(values) is list and _INT.issuperset(map(type, values)):  # plain ints: no user code
        try:
            arr: npt.NDArray[Any] = np.fromiter(values, _I64, len(values))
        except OverflowError:  # 2**63 or more: read below
            pass
        else:
            if not len(arr) or arr.item(arr.argmin()) >= 0:
                return arr
    from_python = False
    if isinstance(values, np.ndarray):
        arr = np.asarray(values)  # a subclass, or a 0-d / 2-D array
    elif isinstance(values, torch.Tensor):
        if not values.is_cpu:
            raise TypeError(
                f"{name} is a tensor on {values.device}; descriptors are filled on the host, "
                f"so move it to the CPU first ({name}.cpu())"
            )
        try:
            arr = np.asarray(values.numpy())  # base class even if a subclass overrides numpy()
        except (TypeError, RuntimeError):
            raise TypeError(
                f"{name} must hold integers, got {_describe(values)}; {_CONVERT}"
            ) from None
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes, bytearray)):
        from_python = True
        items = list(values)  # read once, so that what is checked is what is converted
        try:
            arr = np.asarray(items)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}") from None
        # Ints past 2**63 mixed in, bools, strings, nested sequences: each item checked.
        if arr.dtype.kind not in "iu" or not _SUSPECT.isdisjoint(map(type, items)):
            arr = _python_ints(values, items, name)
    else:
        raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {_describe(values)}; {_CONVERT}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if from_python and arr.dtype.kind == "i":
        _check_non_negative(arr, name)
    return arr


def _python_ints(values: object, items: list[object], name: str) -> npt.NDArray[np.uint64]:
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"{name} must hold integers, got a {type(values).__name__} whose item "
                f"{name}[{i}] = {value!r:.40} is a {type(value).__name__}; pass ints (addresses, "
                "block indices, byte counts)"
            )
        if not 0 <= value <= MAX_ADDRESS:
            raise ValueError(f"{name}[{i}] = {value} does not fit in 64 bits (0..2**64-1)")
    return np.array(items, dtype=np.uint64)


def _describe(values: object) -> str:
    if isinstance(values, (np.ndarray, torch.Tensor)):
        kind = "a numpy array" if isinstance(values, np.ndarray) else "a torch tensor"
        return f"{kind} of dtype {values.dtype}"
    return f"{type(values).__name__} {values!r:.60}"


def _check_non_negative(arr: IntArray, name: str) -> None:
    if len(arr) and arr.item(arr.argmin()) < 0:
        i = int(arr.argmin())
        raise ValueError(f"{name}[{i}] = {arr[i]} is negative; {name} must be >= 0")


def read_block_copies(
    args: tuple[object, ...], total_bytes: object, coalesce: object, dtype: np.dtype[Any]
) -> Plan:
    """Read and check `DescriptorBuffers.add_block_copies`' arguments; plan in int64 (mod 2**64)."""
    first, src_base, dst_base, src_blocks, dst_blocks, block_bytes = args
    op = "add_block_copies"
    if not isinstance(coalesce, (bool, np.bool_)):  # a string or a count would read as true
        raise TypeError(f"{op}: coalesce must be True or False, got {coalesce!r}")
    start = first if type(first) is int else as_integer(first, "first", op)
    bases = []
    for name, value in (("src_base", src_base), ("dst_base", dst_base)):
        base = value if type(value) is int else as_integer(value, name, op)
        if not 0 <= base <= MAX_ADDRESS:
            raise ValueError(f"{op}: {name} must be an address in 0..2**64-1, got {name}={base}")
        bases.append(base)
    step = block_bytes if type(block_bytes) is int else as_integer(block_bytes, "block_bytes", op)
    if not 0 < step <= MAX_BYTES:
        raise ValueError(
            f"{op}: block_bytes must be in 1..2**63-1, got block_bytes={step}; pass the size "
            "of one block in bytes"
        )
    src, dst = _to_array(src_blocks, "src_blocks"), _to_array(dst_blocks, "dst_blocks")
    count = len(src)
    if len(dst) != count:
        raise ValueError(
            f"{op}: src_blocks and dst_blocks must have the same length, got {count} source "
            f"blocks and {len(dst)} destination blocks; pass one destination block per source block"
        )
    trim = 0
    if total_bytes is not None:
        total = as_integer(total_bytes, "total_bytes", op)
        if total < 0 or not (count - 1) * step < total <= count * step:
            raise ValueError(
                f"{op}: total_bytes={total} does not fit {count} blocks of {step} bytes: it "
                f"must be in {max(0, (count - 1) * step + 1)}..{count * step} (every block but "
                "the last is copied whole); pass None to copy whole blocks"
            )
        trim = count * step - total
    if not count:
        empty = np.empty(0, dtype)
        return start, 0, empty, empty, empty
    # Both columns in one array between sentinel blocks (-2: never one before a block), so
    # that the runs' bounds include both ends: at small k a fill costs what its numpy calls
    # do, and most steps below are one call for both columns.
    flat = np.empty(2 * count + 2, _I64)
    flat[1 : count + 1], flat[count + 1 : -1] = src, dst
    unsigned = flat[1:-1].view(_U64)  # a negative index (or one of 2**63 or more) is huge
    extent = (unsigned.item(unsigned.argmax()) + 1) * step
    if extent > MAX_BYTES or max(bases) + extent > MAX_ADDRESS + 1:  # find which, and why
        _check_blocks(src, "src_blocks", bases[0], step)
        _check_blocks(dst, "dst_blocks", bases[1], step)
    flat[0] = flat[-1] = -2
    runs = None  # each run's first copy, then count: where runs were found to merge
    if coalesce and count > 1:
        breaks = (flat[1 : count + 2] - flat[: count + 1]) != 1  # (a temporary per column:
        if not breaks.item(breaks.argmin()):  # half the peak memory of one)
            breaks |= (flat[count + 1 :] - flat[count:-1]) != 1
            bounds = breaks.nonzero()[0]
            runs = bounds if len(bounds) <= count else None
    if runs is not None and len(runs) == 2:  # one run: one copy, its addresses from ints
        src_first = (flat.item(1) * step + bases[0]) & MAX_ADDRESS
        dst_first = (flat.item(count + 1) * step + bases[1]) & MAX_ADDRESS
        ends = np.array([src_first, dst_first], _U64)
        sizes: IntArray | int = count * step - trim
        return start, 1, ends[:1].view(dtype), ends[1:].view(dtype), sizes
    flat *= step  # offsets below 2**63: exact; the bases wrap mod 2**64
    src, dst = flat[1 : count + 1], flat[count + 1 : -1]
    src += bases[0] - (1 << 64) if bases[0] > MAX_BYTES else bases[0]
    dst += bases[1] - (1 << 64) if bases[1] > MAX_BYTES else bases[1]
    sizes = step
    if runs is not None:
        src, dst, sizes = src[runs[:-1]], dst[runs[:-1]], (runs[1:] - runs[:-1]) * step
    if trim:
        sizes = sizes if isinstance(sizes, np.ndarray) else np.full(len(src), sizes, _I64)
        sizes[-1] -= trim
    if dtype is not _I64:
        src, dst = src.view(dtype), dst.view(dtype)
    return start, len(src), src, dst, sizes


def _check_blocks(indices: IntArray, name: str, base: int, step: int) -> None:
    dtype = indices.dtype
    unsigned = indices if dtype.kind == "u" else indices.view(f"u{dtype.itemsize}")
    top = int(unsigned.item(unsigned.argmax()))  # a negative one reads as the largest
    if dtype.kind == "i" and top >> (8 * dtype.itemsize - 1):
        _check_non_negative(indices, name)
    extent = (top + 1) * step
    if extent > MAX_BYTES:
        raise ValueError(
            f"{name} reaches block {top}, byte offset {extent} from its base; a block region "
            "must span less than 2**63 bytes"
        )
    if base + extent > MAX_ADDRESS + 1:
        raise ValueError(
            f"{name} reaches block {top}, which ends at {base + extent}, past the 64-bit "
            f"address space (base {base}, {step} bytes per block)"
        )
