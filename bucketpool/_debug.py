"""Debug checks: poison in idle buffers, checksums of descriptors in flight, call sites.

Nothing here takes the pool's lock or decides who holds a buffer; the pool calls these
functions at the debug levels ``checks`` and ``strict`` (and `site` when tracing) and
reports what they find to the code that caused it.
"""

from __future__ import annotations

import os
import sys
import traceback
import typing
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from bucketpool._errors import UseAfterReleaseError

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer

__all__ = [
    "GuardedView",
    "Site",
    "checksum",
    "describe",
    "format_site",
    "guarded_views",
    "poison",
    "poisoned",
    "site",
]

_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
#: The benchmark is a user of the pool: sites stop at its frames, as at any caller's.
_BENCH_DIR = _PACKAGE_DIR + "bench" + os.sep

#: Where something happened: file and line, the whole stack (``trace=True``), or unknown.
Site = tuple[str, int] | traceback.StackSummary | None
_Arrays = tuple[npt.NDArray[np.integer], ...]


def site(full_stack: bool) -> Site:
    """Return where the caller outside this package is (file and line, or the whole stack).

    Called from the pool's hand-out and release paths, which sit at least two calls below
    user code: the search starts there.
    """
    try:
        frame: FrameType | None = sys._getframe(3)
    except ValueError:  # a shallower stack than the pool's own paths make
        frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_PACKAGE_DIR) or name.startswith(_BENCH_DIR):
            break
        frame = frame.f_back
    if frame is None:
        return None
    if full_stack:
        return traceback.extract_stack(frame)
    return (frame.f_code.co_filename, frame.f_lineno)


def line_of(where: Site) -> tuple[str, int] | None:
    """Return the file and line of *where* (the innermost frame of a stack), if known."""
    if where is None:
        return None
    if isinstance(where, traceback.StackSummary):
        frame = where[-1]
        return (frame.filename, frame.lineno or 0)
    return where


def format_site(where: Site) -> str:
    """Return *where* for a message; say how to record sites when it is unknown."""
    if where is None:
        return "<unknown: make the pool with trace=True or debug='checks' to record sites>"
    if isinstance(where, traceback.StackSummary):
        return "\n" + "".join(where.format())
    return f"{where[0]}:{where[1]}"


def describe(n: int, acquired: Site, released: Site = None) -> str:
    """Say which hand-out: ``a buffer (n=5, acquired at f.py:3, released at f.py:9)``."""
    parts = [f"n={n}", f"acquired at {format_site(acquired)}"]
    if released is not None:
        parts.append(f"released at {format_site(released)}")
    return f"a buffer ({', '.join(parts)})"


def checksum(arrays: _Arrays, n: int) -> int:
    """Return a CRC of the first *n* entries of the three fields."""
    value = 0
    for array in arrays:
        value = zlib.crc32(array[:n].data, value)
    return value


def poison(arrays: _Arrays, n: int) -> None:
    """Zero the first *n* sizes of a released buffer: a stale batched copy moves nothing."""
    arrays[2][:n].fill(0)


def poisoned(arrays: _Arrays, n: int) -> bool:
    """Return whether the first *n* sizes still hold the 0 that `poison` left.

    Sizes are what every descriptor write sets (``add_copies`` writes all three fields), so
    one comparison of one field finds a stale write and keeps ``checks`` cheap; a stale
    write of addresses alone is caught at ``strict``, where stale views refuse to be used.
    """
    data = arrays[2][:n].tobytes()
    return data == bytes(len(data))


# -- strict: views that refuse to be used after their hand-out ended -----------------------


class _Owner(typing.NamedTuple):
    """The hand-out a guarded view belongs to."""

    buffer: Buffer
    token: int
    n: int
    site: Site


#: Operations a stale view may still do: printing it in a debugger or a log must not raise.
_HARMLESS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__str__})


@typing.final
class GuardedView(torch.Tensor):
    """A view of a pool buffer that raises `UseAfterReleaseError` once its hand-out ends.

    Handed out at debug level ``strict``.  Every torch operation on it (indexing, reading,
    writing, passing it to an op) first checks that the hand-out is still live; views cut
    from it are guarded the same way.  Kept in a local, an attribute, a container or
    returned from a function, a view is caught where it is used after the ``with`` block.
    """

    _bp_owner: _Owner

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., object],
        types: Iterable[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        """Check the hand-out of every guarded argument, run *func*, guard views it returns."""
        kwargs = kwargs or {}
        owner = None
        if func not in _HARMLESS:
            for value in (*args, *kwargs.values()):
                for item in value if isinstance(value, (list, tuple)) else (value,):
                    if type(item) is GuardedView:
                        owner = item._bp_owner
                        if owner.buffer.token != owner.token:
                            raise _stale(owner, func)
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        if owner is not None and isinstance(result, torch.Tensor):
            return _guard_if_view(result, owner)
        return result


def guarded_views(buffer: Buffer, token: int, n: int) -> tuple[torch.Tensor, ...]:
    """Cut three guarded views of *n* entries for the hand-out *token* of *buffer*."""
    owner = _Owner(buffer, token, n, buffer.site)
    views = []
    for tensor in buffer.tensors:
        with torch._C.DisableTorchFunctionSubclass():
            plain = tensor[:n]
        view = plain.as_subclass(GuardedView)
        view._bp_owner = owner
        views.append(view)
    return tuple(views)


def _guard_if_view(result: torch.Tensor, owner: _Owner) -> torch.Tensor:
    try:
        with torch._C.DisableTorchFunctionSubclass():
            data = result.untyped_storage().data_ptr()
            shares = any(data == t.untyped_storage().data_ptr() for t in owner.buffer.tensors)
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...: not a view of ours
        return result
    if not shares:
        return result
    view = result.as_subclass(GuardedView)
    view._bp_owner = owner
    return view


def _stale(owner: _Owner, func: Callable[..., object]) -> UseAfterReleaseError:
    name = getattr(func, "__name__", repr(func))
    return UseAfterReleaseError(
        f"{name}: a view of {describe(owner.n, owner.site)} was used after the hand-out "
        "ended (its with block exited or the handle was released). Use views only while the "
        "handle is held; copy data out with tensor.clone() to keep it"
    )
