"""bucketpool behind vLLM's descriptor-pool hook (``set_descriptor_pool_factory``): no rebinding.

A vLLM with the hook (``upstream/``'s patch) asks a factory for each call site's pool.
`bucketpool.vllm.descriptor_pool_factory` answers with a `HookPool` over what ``install``
hands out: the compat adapter's six-field tuples or the KV drop-in's three tensors, which
it passes in (this module is a floor below them).
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import torch

from bucketpool._handle import BufferHandle
from bucketpool._lend import cached_fields
from bucketpool._parking import wait
from bucketpool._pool import BucketPool
from bucketpool._views import CompletionEvent

__all__ = ["DescriptorPool", "DescriptorSpec", "HookPool", "check", "find", "give_back", "serving"]

HOOK = "vllm.utils.descriptor_pool"  # where the patch puts the hook
_Factory = Callable[["DescriptorSpec"], "DescriptorPool"]


class DescriptorSpec(Protocol):
    """vLLM's ``DescriptorSpec``: the descriptor buffers a call site asks its pool for."""

    @property
    def name(self) -> str:
        """The call site: ``"ec_cpu"``, ``"kv_offload"`` or ``"hisparse"``."""

    @property
    def dtype(self) -> torch.dtype:
        """``torch.int64``, or ``torch.uint64`` on XPU."""

    @property
    def pin_memory(self) -> bool:
        """Whether the buffers are page-locked."""

    @property
    def aliased(self) -> bool:
        """Six fields (three tensors, their numpy aliases), or three tensors."""


class DescriptorPool(Protocol):
    """vLLM's ``DescriptorPool``, as bucketpool serves it over a `BucketPool`.

    ``acquire(n)`` hands out *n*'s whole bucket (a power of two, at least 16 entries) in the
    spec's shape: an `AliasedDescriptorBuffers` (the fields of vLLM's ``DescriptorBuffers``),
    or a tuple of three tensors, each of which holds the hand-out, as
    ``install(kv_offload=True)`` hands them out.  As thread-safe as the `BucketPool`.
    """

    @property
    def pool(self) -> BucketPool:
        """The `BucketPool` behind it: its stats, `BucketPool.trim`."""

    def acquire(self, n: int) -> Any:
        """Return *n*'s whole bucket in the spec's shape.

        Raises:
            TypeError, ValueError: *n* is not an integer from 0 to the pool's ``max_capacity``.
        """

    def release(self, bufs: Any, end_event: object = None) -> None:
        """Give *bufs* back; with *end_event*, parked until ``end_event.query()`` is true.

        An *end_event* whose ``query()`` raises `RuntimeError` (a device fault, as vLLM
        reads it) reads as not done: the buffer stays parked, and neither this nor
        `collect` raises it.  A triple no bucketpool handed out (one the call site made) is
        let go, as vLLM lets it go; one from another pool goes back to that pool.

        Raises:
            ReleaseError: released already; (six fields) not from this pool; (three
                tensors) tensors of two hand-outs.  Nothing changes.
            TypeError: *end_event* has no ``query()``; *bufs* stays acquired.
            Exception: another error ``end_event.query()`` raised, once released (parked).
        """

    def collect(self) -> None:
        """Retire the parked buffers whose end events are done (`BucketPool.collect`)."""

    def shutdown(self) -> None:
        """Wait for the parked buffers' end events, then free every cached buffer.

        Raises:
            Exception: what an end event's ``synchronize()`` raised; its buffer stays
                parked, and every cached one is freed all the same.
        """


@typing.final
class HookPool:
    """A `DescriptorPool`: *pool*, lent by *acquire*, given back by ``give_back(bufs, event=)``.

    *acquire* is bound as it is: a leak names vLLM's line.  *lent*: an adapter's tuple class.
    """

    __slots__ = ("_give_back", "_lent", "acquire", "pool", "spec")

    def __init__(
        self,
        spec: DescriptorSpec,
        pool: BucketPool,
        acquire: Callable[[int], Any],
        give_back: Callable[..., None],
        lent: Callable[..., Any] | None = None,
    ) -> None:
        self.spec, self.pool, self.acquire = spec, pool, acquire
        self._give_back, self._lent = give_back, lent

    def release(self, bufs: Any, end_event: object = None) -> None:
        """See `DescriptorPool.release`."""
        self._give_back(bufs, event=None if end_event is None else _DeviceEvent(end_event))

    def collect(self) -> None:
        """See `DescriptorPool.collect`."""
        self.pool.collect()

    def shutdown(self) -> None:
        """See `DescriptorPool.shutdown`."""
        try:
            self.pool.synchronize()
        finally:
            self.pool.empty_cache()

    @property
    def _pool(self) -> list[Any]:
        """For vLLM's tests, as the compat adapters' (docs/compat.md): the cached tuples."""
        lent = self._lent
        return [] if lent is None else [lent(*fields) for fields in cached_fields(self.pool)]


class _DeviceEvent:
    """An end event whose ``query()`` raising `RuntimeError` (a device fault) reads as not done."""

    __slots__ = ("event",)

    def __init__(self, event: object) -> None:
        if not callable(getattr(event, "query", None)):
            raise TypeError(
                "release: end_event needs a query() -> bool method (torch.Event), got "
                f"{type(event).__name__}; the buffers stay acquired"
            )
        self.event = typing.cast("CompletionEvent", event)

    def query(self) -> bool:
        try:
            return bool(self.event.query())
        except RuntimeError:
            return False

    def synchronize(self) -> None:
        wait([self.event])  # its synchronize(), else polling its query(): errors raise


def give_back(
    holder: Callable[[Any], BufferHandle | None], triple: Any, *, event: object = None
) -> None:
    """Release the hand-out *triple* holds (*holder* finds it), parked on *event*.

    A triple no bucketpool lent (*holder* returns None) is let go, as vLLM lets it go.
    """
    handle = holder(triple)
    if handle is not None:
        if event is not None:
            handle.record_event(typing.cast("CompletionEvent", event))
        handle.release()


def check(spec: DescriptorSpec) -> torch.dtype:
    """Return *spec*'s dtype, if bucketpool serves what it asks for.

    Raises:
        TypeError: a dtype other than int64 and uint64.
        ValueError: pinned six-field buffers (bucketpool pins three-tensor ones only).
    """
    if spec.dtype not in (torch.int64, torch.uint64):
        raise TypeError(
            f"vLLM's {spec.name!r} call site asks for {spec.dtype} descriptors; bucketpool "
            "serves int64 and uint64 ones: leave it to vLLM's pool (a factory that returns "
            "None for it)"
        )
    if spec.aliased and spec.pin_memory:
        raise ValueError(
            f"vLLM's {spec.name!r} call site asks for pinned six-field descriptors; "
            "bucketpool pins three-tensor ones only (aliased=False): leave it to vLLM's pool "
            "(a factory that returns None for it)"
        )
    return spec.dtype


def serving(kv_offload: bool, factory: _Factory) -> Callable[[Any], Any]:
    """Return a factory serving vLLM's EC CPU worker, and its KV-offload handlers if asked.

    The other call sites (HiSparse; without *kv_offload*, the KV-offload handlers) it leaves
    to vLLM's pool.
    """
    wanted = {"ec_cpu", "kv_offload"} if kv_offload else {"ec_cpu"}

    def serve(spec: DescriptorSpec) -> DescriptorPool | None:
        return factory(spec) if spec.name in wanted else None

    return serve


def find() -> ModuleType | None:
    """Return vLLM's hook module, if this vLLM has ``set_descriptor_pool_factory``; else None."""
    try:
        module = importlib.import_module(HOOK)
    except ModuleNotFoundError as error:
        if error.name not in ("vllm", "vllm.utils", HOOK):
            raise  # the hook is there, and something it imports is not
        return None
    return module if callable(getattr(module, "set_descriptor_pool_factory", None)) else None
