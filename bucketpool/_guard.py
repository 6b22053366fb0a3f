"""Debug level ``strict``: views and arrays that refuse to be used once their hand-out ends.

Every hand-out at ``strict`` gets views of its own (`GuardedView`): every torch operation
on one, and on any view cut from it, first checks that the hand-out is live, and raises
`UseAfterReleaseError` once it is over.  The numpy side is guarded as well: arrays from
``handle.arrays`` or ``view.numpy()`` are `GuardedArray` objects, and so is every array numpy
derives from one (slices, ``.view()``, reshapes); all of them are made read-only when the
hand-out ends, so a stale numpy write raises.  Not caught: raw memory taken past numpy
(``memoryview``, ``np.frombuffer``, ``ctypes`` pointers, ``torch.from_numpy`` of an array).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bucketpool._errors import UseAfterReleaseError
from bucketpool._types import DescriptorArrays
from bucketpool._verify import describe

if TYPE_CHECKING:
    from bucketpool._buffer import Buffer

__all__ = ["GuardedArray", "GuardedView", "guarded_arrays", "guarded_views"]


class _Owner(typing.NamedTuple):
    """The hand-out a guarded view belongs to."""

    buffer: Buffer
    token: int
    n: int
    site: object


#: Operations a stale view may still do: printing it in a debugger or a log must not raise.
_HARMLESS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__str__})
#: Operations that return numpy arrays of the view's memory: those are guarded too.
_TO_NUMPY: frozenset[object] = frozenset((torch.Tensor.numpy, torch.Tensor.__array__))


#: A strict hand-out's record of its arrays: the list the end of the hand-out makes
#: read-only, and the address range of the buffer's memory.
_Guard = tuple[list["np.ndarray[Any, Any]"], int, int]


class GuardedArray(np.ndarray):
    """A numpy array of a strict hand-out's memory; arrays numpy derives from it are too.

    Each array of the buffer's memory is added to the hand-out's list, which the end of the
    hand-out makes read-only; an array numpy derives from one but that has memory of its
    own (a ufunc's result) is left alone.
    """

    _bp_guard: _Guard | None = None

    def __array_finalize__(self, obj: object) -> None:
        guard: _Guard | None = getattr(obj, "_bp_guard", None)
        if guard is None:
            return
        handed, low, high = guard
        if low <= self.__array_interface__["data"][0] < high:
            self._bp_guard = guard
            handed.append(self)


@typing.final
class GuardedView(torch.Tensor):
    """A view of a pool buffer that raises `UseAfterReleaseError` once its hand-out ends.

    Kept in a local, an attribute, a container or returned from a function, a view is
    caught where it is used after the ``with`` block.  ``copy.deepcopy`` of a live view
    gives a plain copy of its data.
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
        """Check the hand-out of every guarded argument, run *func*, guard what it returns."""
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
            if func is torch.Tensor.__deepcopy__:
                return typing.cast("torch.Tensor", args[0]).clone()
            result = func(*args, **kwargs)
        if owner is None:
            return result
        if func in _TO_NUMPY and isinstance(result, np.ndarray):
            return _guard_array(result, owner.buffer)
        if isinstance(result, torch.Tensor):
            return _guard_if_view(result, owner)
        if type(result) in (tuple, list):  # split, chunk, unbind, tensor_split: views too
            items = typing.cast("Sequence[object]", result)
            guarded = [
                _guard_if_view(item, owner) if isinstance(item, torch.Tensor) else item
                for item in items
            ]
            return tuple(guarded) if type(result) is tuple else guarded
        return result


def guarded_views(buffer: Buffer, token: int, n: int) -> tuple[torch.Tensor, ...]:
    """Cut three guarded views of *n* entries for the hand-out *token* of *buffer*."""
    owner = _Owner(buffer, token, n, buffer.site)
    capacity = buffer.bucket.capacity
    views = []
    for field in range(3):
        with torch._C.DisableTorchFunctionSubclass():
            plain = buffer.base[field * capacity : field * capacity + n]
        view = plain.as_subclass(GuardedView)
        view._bp_owner = owner
        views.append(view)
    return tuple(views)


def guarded_arrays(buffer: Buffer, n: int) -> DescriptorArrays:
    """Numpy arrays of the first *n* entries for a strict hand-out, made read-only at its end."""
    src, dst, sizes = buffer.arrays
    return (
        _guard_array(src[:n], buffer),
        _guard_array(dst[:n], buffer),
        _guard_array(sizes[:n], buffer),
    )


def _guard_array(array: np.ndarray[Any, Any], buffer: Buffer) -> Any:
    guarded = array.view(GuardedArray)
    low = buffer.storage.data_ptr()  # where the memory is now (share_memory_ moves it)
    guarded._bp_guard = (buffer.handed, low, low + buffer.storage.nbytes())
    buffer.handed.append(guarded)
    return guarded


def _guard_if_view(result: torch.Tensor, owner: _Owner) -> torch.Tensor:
    try:
        with torch._C.DisableTorchFunctionSubclass():  # the buffer's storage, wherever it is
            shares = result.untyped_storage()._cdata == owner.buffer.storage._cdata
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
        f"{name}: a view of {describe(owner.n, owner.site)} was used after the hand-out "  # type: ignore[arg-type]
        "ended (its with block exited or the handle was released). Use views only while the "
        "handle is held; copy data out with tensor.clone() to keep it"
    )
