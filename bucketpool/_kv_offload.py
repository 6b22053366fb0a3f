"""Serve vLLM's KV-offload handlers' descriptors from bucketpool: ``install(kv_offload=True)``.

What is rebound and wrapped, and why: docs/compat.md, "vLLM's KV-offload handlers".  Its
`install` and `uninstall` run under `bucketpool.vllm`'s lock; that module finds the modules.
"""

from __future__ import annotations

import contextlib
import functools
import typing
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

import torch

from bucketpool import _lend
from bucketpool._errors import ReleaseError
from bucketpool._handle import BufferHandle
from bucketpool._pool import BucketPool
from bucketpool._settings import check_count

__all__ = ["install", "probe", "uninstall"]

_NAME = "_new_descriptor_buffers"
_HANDLE = "_bucketpool_handle"  # on each tensor handed out: a `_Hold` of the hand-out
_HANDLER = ("__init__", "transfer_async", "get_finished", "shutdown")  # a handler's methods
_FIELDS = ("batch_src", "batch_dst", "batch_sizes")  # a transfer's triple
_Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_swaps: list[tuple[object, str, object, object]] = []  # (owner, name, original, replacement)
_pools: dict[tuple[torch.dtype, bool], BucketPool] = {}


class _Hold:
    """What the three tensors of a hand-out share: its handle; a deep copy or pickle is None."""

    __slots__ = ("handle",)

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        return type(None), ()  # a tensor's deep copy or pickle is new memory: it holds nothing


def _descriptors(pool: BucketPool, n: int) -> _Triple:
    """``_new_descriptor_buffers(n)``: a whole bucket (>= *n*) as three tensors that hold it."""
    if type(n) is not int or not 0 <= n <= pool.settings.max_capacity:
        n = check_count(n, pool.settings.max_capacity)
    handle = _lend.lend(pool, n)
    hold = _Hold(handle)
    triple = typing.cast("_Triple", _lend.holding(handle, hold))
    for tensor in triple:  # (each, for `_holder`; a slice finds it through its memory)
        setattr(tensor, _HANDLE, hold)
    return triple


def _holder(triple: Sequence[object]) -> BufferHandle | None:
    """The handle *triple*'s tensors hold; None for a triple bucketpool did not hand out."""
    hold = getattr(triple[0], "__dict__", {}).get(_HANDLE) if len(triple) == 3 else None
    if hold is None and not any(getattr(each, "__dict__", {}).get(_HANDLE) for each in triple):
        return None
    if hold is None or any(
        getattr(each, "__dict__", {}).get(_HANDLE) is not hold for each in triple
    ):
        raise ReleaseError(
            f"these {len(triple)} tensors are not one triple of _new_descriptor_buffers(n) "
            "(they mix hand-outs, or lack one); append the three it returned, together"
        )
    return typing.cast("_Hold", hold).handle


class _Returns(list[_Triple]):
    """A handler's ``_buffer_pool``: ``append`` releases a pool's triple, keeps any other.

    ``append`` raises `ReleaseError` for a triple released already or mixing hand-outs.
    """

    __slots__ = ()

    def append(self, triple: _Triple) -> None:
        handle = _holder(triple)
        if handle is None:
            super().append(triple)
        elif not _lend.give_back(handle):
            handle.release()


def _wrap_transfer(original: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(original)
    def transfer_async(self: Any, *args: object, **kwargs: object) -> bool:
        if type(getattr(self, "_buffer_pool", None)) is list:  # vLLM's: releases the pool's
            triples, self._buffer_pool = self._buffer_pool, _Returns()  # (their copies are done)
            for triple in triples:
                self._buffer_pool.append(triple)
        return original(self, *args, **kwargs)

    return transfer_async


def _wrap_finished(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_finished(self: Any, *args: object, **kwargs: object) -> Any:
        queued = tuple(self._transfers) if getattr(self, "_transfers", None) else ()
        try:
            results = original(self, *args, **kwargs)
        except BaseException:
            _release_dropped(self, queued)  # what it dropped before it raised
            raise
        if queued and not all(getattr(each, "success", True) for each in results or ()):
            _release_dropped(self, queued)  # vLLM 0.34 drops a failed transfer's triple
        return results

    return get_finished


def _wrap_shutdown(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def shutdown(self: Any, *args: object, **kwargs: object) -> object:
        transfers = tuple(getattr(self, "_transfers", ()))
        kept = list(getattr(self, "_buffer_pool", ()))  # a plain list's triples
        try:
            return original(self, *args, **kwargs)
        finally:  # not what vLLM still queues; after a failed sync, parked on the end event
            _release_dropped(self, transfers, kept)

    return shutdown


def _release_dropped(
    handler: Any, transfers: Sequence[object], kept: Iterable[object] = ()
) -> None:
    """Release the triples *handler* dropped of *transfers*', parked on their end events.

    Dropped: no longer queued, nor appended to a plain list (a triple there stays vLLM's).
    A copy may still read one, so it comes back once its event is done (never, where the
    device stopped answering).  Each of *kept* comes back as it is.
    """
    queued = {id(each) for each in getattr(handler, "_transfers", ())}
    listed = {id(triple[0]) for triple in getattr(handler, "_buffer_pool", ()) if triple}
    parting: list[tuple[Any, Any]] = [(triple, None) for triple in kept]
    for each in transfers:
        triple = [getattr(each, field, None) for field in _FIELDS]  # (some copies keep none)
        if id(each) not in queued and id(triple[0]) not in listed:
            parting.append((triple, getattr(each, "end_event", None)))
    for triple, event in parting:
        with contextlib.suppress(Exception):  # a lost device's query(): parked
            handle = _holder(triple)
            if handle is not None and not handle.released:
                if event is not None:
                    handle.record_event(event)
                handle.release()


def probe(make: Callable[[], Sequence[torch.Tensor]], where: str) -> tuple[torch.dtype, bool]:
    """The one (dtype, pinned) of the three tensors *make* returns, asking vLLM at *where*.

    Raises:
        RuntimeError: *make* raised, or its tensors are not three of one int64 or uint64
            dtype and one pinning; nothing was replaced.
    """
    try:
        tensors = tuple(make())
        (dtype, pinned), *others = {(each.dtype, each.is_pinned()) for each in tensors}
        if len(tensors) != 3 or others or dtype not in (torch.int64, torch.uint64):
            raise TypeError(
                f"its tensors have dtypes {tuple(each.dtype for each in tensors)}; bucketpool "
                "serves three of one dtype, int64 or uint64, and one pinning, so this vLLM is "
                "not supported"
            )
    except Exception as error:
        raise RuntimeError(
            f"could not ask {where} for descriptors bucketpool can serve "
            f"({type(error).__name__}: {error}); nothing was replaced"
        ) from error
    return dtype, pinned


def install(modules: Iterable[ModuleType]) -> None:
    """Rebind and wrap in every one of *modules* that has them and is not served yet.

    Raises:
        RuntimeError: a ``_new_descriptor_buffers`` makes buffers bucketpool cannot serve.
    """
    ours = {id(new) for *_, new in _swaps}
    made: dict[int, object] = {}
    swaps: list[tuple[object, str, object, object]] = []
    for module in modules:
        found = vars(module).get(_NAME)
        if callable(found) and id(found) not in ours:
            if id(found) not in made:  # `_descriptors` over the pool of what it makes
                key = probe(functools.partial(found, 1), f"{module.__name__}.{_NAME}(1)")
                if key not in _pools:
                    _pools[key] = BucketPool(dtype=key[0], pin_memory=key[1])
                made[id(found)] = functools.partial(_descriptors, _pools[key])
            swaps.append((module, _NAME, found, made[id(found)]))
        for each in list(vars(module).values()):
            mine = isinstance(each, type) and each.__module__ == module.__name__
            methods = vars(each) if mine else {}
            if all(m in methods for m in _HANDLER) and id(methods["shutdown"]) not in ours:
                transfer, shutdown = methods["transfer_async"], methods["shutdown"]
                finished = methods["get_finished"]
                swaps += [(each, "transfer_async", transfer, _wrap_transfer(transfer))]
                swaps += [(each, "get_finished", finished, _wrap_finished(finished))]
                swaps += [(each, "shutdown", shutdown, _wrap_shutdown(shutdown))]
    for owner, attribute, _, new in swaps:
        setattr(owner, attribute, new)
    _swaps.extend(swaps)


def uninstall() -> list[tuple[object, object]]:
    """Put back every original `install` replaced, where its replacement is still bound.

    Returns ``(replacement, original)`` pairs: the caller rebinds where modules bound one since.
    """
    for owner, name, original, new in reversed(_swaps):
        if vars(owner).get(name) is new:
            setattr(owner, name, original)
    undone = [(new, original) for *_, original, new in _swaps]
    _swaps.clear()
    _pools.clear()  # each pool goes with the last of its hand-outs
    return undone
