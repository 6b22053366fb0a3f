"""Reading and checking a fill's inputs: the only place where a fill runs user code.

A fill runs in two phases.  Here the arguments are read -- an argument's ``__index__``, a
sequence's ``__len__``, ``__iter__`` and ``__getitem__``, a tensor's ``numpy()``, an ndarray
subclass's methods run here and only here -- and every value is checked, converted and (for
block copies, in `bucketpool._blocks`, which reads through the functions here) planned into
runs.  The plans hold only Python ints and base-class ``numpy.ndarray`` objects
(``np.asarray`` reads a subclass as a base-class view), so the writer (`bucketpool._fill`),
which runs numpy on a plan and its destination arrays only, cannot call back into user code
between the checks and the writes.  A plan's arrays may be the caller's own where no
conversion was needed, so they must not change before the plan is written; the writer,
which knows the destination, checks that a plan fits it and copies an input that may share
memory with it.
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

__all__ = [
    "MAX_ADDRESS",
    "MAX_BYTES",
    "CopyPlan",
    "as_integer",
    "check_address",
    "check_non_negative",
    "read_copies",
    "to_array",
]

#: The largest address: addresses are 64-bit patterns.
MAX_ADDRESS = (1 << 64) - 1
#: The largest byte count, and the bound on a block region's span.
MAX_BYTES = (1 << 63) - 1
_I64 = np.dtype(np.int64)
_ACCEPTED = "a 1-D numpy integer array, a CPU integer tensor or a sequence of ints"
_OP = "add_copies"


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
    start = first if type(first) is int else as_integer(first, "first", _OP)
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


def as_integer(value: object, name: str, op: str) -> int:
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


def check_address(value: int, name: str, op: str) -> None:
    """Raise a ValueError naming *name* unless *value* is in 0..2**64-1."""
    if not 0 <= value <= MAX_ADDRESS:
        raise ValueError(f"{op}: {name} must be an address in 0..2**64-1, got {name}={value}")


def _byte_count(value: object, name: str, op: str) -> int:
    count = value if type(value) is int else as_integer(value, name, op)
    if not 0 <= count <= MAX_BYTES:
        raise ValueError(f"{op}: {name} must be a byte count in 0..2**63-1, got {name}={count}")
    return count


def _describe(values: object) -> str:
    if isinstance(values, np.ndarray):
        return f"a numpy array of dtype {values.dtype}"
    if isinstance(values, torch.Tensor):
        return f"a tensor of dtype {values.dtype}"
    return f"{type(values).__name__} {values!r:.60}"


def to_array(values: object, name: str) -> IntArray:
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
        items = list(values)  # read once, so that what is checked is what is converted
        try:
            arr = np.asarray(items)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}") from None
        if arr.dtype.kind in "fO" and arr.ndim == 1:
            # numpy reads a list mixing ints >= 2**63 with other ints as float64 (inexact),
            # and ints beyond 64 bits as objects: read such lists exactly, or reject them.
            arr = _python_ints(items, name)
        elif arr.dtype.kind in "iu" and not _SUSPECT.isdisjoint(map(type, items)):
            arr = _python_ints(items, name)  # numpy took bools (0-d arrays too) as ints: refused
    else:
        raise TypeError(f"{name} must be {_ACCEPTED}, got {_describe(values)}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {_describe(arr)}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if from_python and arr.dtype.kind == "i":
        check_non_negative(arr, name)
    return arr


#: Items numpy reads as ints in a list that are not ints (a 0-d array may hold a bool).
_SUSPECT = frozenset((bool, np.bool_, np.ndarray))


def _python_ints(items: Sequence[object], name: str) -> npt.NDArray[np.uint64]:
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"{name} must hold integers, got {name}[{i}] = {value!r} ({type(value).__name__})"
            )
        if not 0 <= value <= MAX_ADDRESS:
            raise ValueError(f"{name}[{i}] = {value} does not fit in 64 bits (0..2**64-1)")
    return np.array(items, dtype=np.uint64)


def check_non_negative(arr: IntArray, name: str) -> None:
    """Raise a ValueError naming the smallest entry of *arr* if it is negative."""
    if len(arr) and arr[arr.argmin()] < 0:
        i = int(arr.argmin())
        raise ValueError(f"{name}[{i}] = {arr[i]} is negative; {name} must be >= 0")


def _addresses(values: object, name: str, target: np.dtype[Any]) -> IntArray:
    arr = to_array(values, name)
    if arr.dtype.itemsize == 8:
        # int64 input is taken as a bit pattern; a view reinterprets it for free.
        return arr if arr.dtype == target else arr.view(target)
    if arr.dtype.kind == "i":
        check_non_negative(arr, name)
    return arr.astype(target)


def _byte_counts(values: object, target: np.dtype[Any]) -> IntArray:
    arr = to_array(values, "byte_counts")
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
