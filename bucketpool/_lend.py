"""What the adapters lend: whole buckets, as the tensors vLLM's pools hand out.

The compat adapters (`bucketpool.compat`) and the KV-offload drop-in
(`bucketpool._kv_offload`) hand out a pool's buffers as vLLM's callers expect them: the
whole bucket, its three fields as tensors (and numpy arrays), with no view of ``n``.  Their
hand-out (`lend`) skips what `BucketPool.acquire` does for its own callers, and each kind
of tensors is made once per buffer or once per hand-out:

- `fields`: a compat tuple's fields, made once per buffer and mode at ``off`` (plain, or
  inference tensors under ``torch.inference_mode()``, as vLLM's pool makes them there),
  anew for each hand-out at the debug levels, as view sets are.  The tuple holds the
  handle; a tuple dropped unreleased is a leak.
- `holding`: the KV drop-in's three tensors, new for each hand-out, whose memory keeps the
  hand-out's hold alive: a tensor, a slice or an array of one holds it.

Both kinds are made over the buffer's numpy arrays (``torch.from_numpy``), so no holder can
resize the memory the pool's arrays write through.
"""

from __future__ import annotations

import sys
from typing import Any, SupportsIndex

import numpy as np
import torch

from bucketpool import _debug
from bucketpool._errors import ReleaseError, reentered
from bucketpool._handle import BufferHandle
from bucketpool._ledger import EMPTY
from bucketpool._lock import LATE, owned
from bucketpool._pool import BucketPool
from bucketpool._views import IntegerInput, fill

__all__ = ["belongs", "cached_fields", "fields", "holding", "lend", "lent_add_copies"]

_getframe = sys._getframe
_new = object.__new__


def lend(pool: BucketPool, n: int) -> BufferHandle:
    """(an adapter) A hand-out of *n*'s whole bucket (*n* checked); its site: the adapter's caller.

    Raises:
        PoolError: called from a finaliser that interrupted this thread inside the pool.
    """
    bucket = pool._by_bits[((n or 1) - 1).bit_length()]
    if owned():
        raise reentered("acquire")
    frame = _getframe(2)  # ~lasti: the site of an adapter's hand-out (its advice differs)
    code, lasti, n = frame.f_code, ~frame.f_lasti, bucket.capacity
    handle = _new(BufferHandle)
    handle._pool, handle._n = pool, n
    got: object = EMPTY
    if bucket.free or bucket.inbox:
        got = pool._ledger.serve(bucket, n, handle, code, lasti)
    if got is not handle or pool._watching or LATE:
        pool._served(got, bucket, n, handle, code, lasti)
    return handle


def cached_fields(pool: BucketPool) -> list[tuple[object, ...]]:
    """(compat `_pool`) The `fields` of *pool*'s cached buffers that an adapter handed out.

    Bucket by bucket, the least recently used first; in each, the most recently cached last.
    """
    pool._outside("_pool")  # refused inside a move (the lock is taken below); drains
    ledger = pool._ledger
    found = []
    for bucket in sorted(ledger.buckets, key=lambda bucket: bucket.last_tick):
        for buffer in ledger.cached_in(bucket):
            lent = buffer.lent[buffer.lent_mode]
            if lent is not None:
                found.append(lent)
    return found


def fields(handle: BufferHandle, inference: bool) -> tuple[Any, ...]:
    """(a compat adapter) The whole fields of *handle*'s new hand-out (see `Buffer.lend`)."""
    buffer = handle._buffer
    found = buffer.lent[inference]  # `Buffer.lend`'s usual case, without a call
    if found is None or buffer.own_views or buffer.storage.data_ptr() != buffer.address:
        return buffer.lend(inference)
    buffer.lent_mode = inference
    return found


def belongs(handle: BufferHandle, pool: object) -> bool:
    """(a compat adapter) Whether *pool* handed *handle* out."""
    return handle._pool is pool


def lent_add_copies(
    bufs: Any,
    first: SupportsIndex,
    sources: IntegerInput,
    destinations: IntegerInput,
    byte_counts: IntegerInput | SupportsIndex,
    *,
    step: SupportsIndex = 1,
) -> int:
    """A compat tuple's ``add_copies``: `DescriptorBuffers.add_copies` over its whole bucket.

    Raises:
        ReleaseError: the tuple was released (its buffer may be another's now).
        CapacityError, ValueError, TypeError: as for `DescriptorBuffers.add_copies`.
    """
    handle = bufs._handle
    buffer = handle._buffer  # its memory cannot move during the hand-out (`Buffer.lend`)
    args = (first, sources, destinations, byte_counts, step)
    end = fill(buffer.arrays_, buffer, handle._token, buffer.bucket.capacity, *args)
    if end is None:
        raise ReleaseError(
            f"add_copies: this {type(bufs).__name__} was released; its buffer may be handed "
            "out again. Write descriptors before pool.release(bufs), or acquire a new triple"
        )
    return end


class _Carrier(np.ndarray[Any, Any]):
    """A view of a buffer's field that carries what holds a hand-out (`holding`)."""

    hold: object


def holding(handle: BufferHandle, hold: object) -> tuple[torch.Tensor, ...]:
    """(the KV drop-in) Three new tensors of *handle*'s whole fields that keep *hold* alive.

    Each is made from a numpy view that carries *hold* and that its memory keeps alive, so
    the tensor, a slice or view of it, or an array of one (``.numpy()``) keeps *hold*
    alive, also under ``torch.inference_mode()`` (where a view keeps no link to its base).
    Their memory cannot be resized.  At ``strict`` they are guarded views.
    """
    buffer = handle._buffer
    made = []
    for field in buffer.arrays:
        carrier = field.view(_Carrier)
        carrier.hold = hold
        made.append(torch.from_numpy(carrier))
    if buffer.strict:
        return _debug.guarded(made, buffer, handle._token)
    return tuple(made)
