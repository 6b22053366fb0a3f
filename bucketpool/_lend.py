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
resize the memory the pool's arrays write through.  A *pool* here is a `BucketPool` (not
imported: the adapters' rooms stay one floor above the pool's).
"""

from __future__ import annotations

import sys
from typing import Any, SupportsIndex

import numpy as np
import torch

from bucketpool import _debug
from bucketpool._buffer import VIEW_SET_BYTES
from bucketpool._errors import InFlightReleaseWarning, ReleaseError, reentered
from bucketpool._handle import BufferHandle
from bucketpool._ledger import EMPTY
from bucketpool._lock import LATE, owned
from bucketpool._settings import check_count
from bucketpool._views import CompletionEvent

__all__ = ["acquire", "cached_fields", "give_back", "holding", "lend", "release"]

_getframe = sys._getframe
_new = object.__new__
_inference = torch.is_inference_mode_enabled


def lend(pool: Any, n: int, depth: int = 2) -> BufferHandle:
    """(an adapter) A hand-out of *n*'s whole bucket (*n* checked), for the site *depth* up.

    Raises:
        PoolError: called from a finaliser that interrupted this thread inside the pool.
    """
    bucket = pool._by_bits[((n or 1) - 1).bit_length()]
    if owned():
        raise reentered("acquire")
    frame = _getframe(depth)  # ~lasti: the site of an adapter's hand-out (its advice differs)
    code, lasti, n = frame.f_code, ~frame.f_lasti, bucket.capacity
    handle = _new(BufferHandle)
    handle._pool, handle._n = pool, n
    got: object = EMPTY
    if bucket.free or bucket.inbox:
        got = pool._ledger.serve(bucket, n, handle, code, lasti)
    if got is not handle or pool._watching or LATE:
        pool._served(got, bucket, n, handle, code, lasti)
    return handle


def cached_fields(pool: Any) -> list[tuple[object, ...]]:
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


def acquire(adapter: Any, n: SupportsIndex) -> Any:
    """A compat adapter's ``acquire(n)``: a tuple of the whole bucket that holds the hand-out."""
    pool = adapter.pool
    if type(n) is not int or not 0 <= n <= pool._max_capacity:
        n = check_count(n, pool._max_capacity)
    handle = lend(pool, n, 3)
    buffer = handle._buffer
    inference = _inference()
    fields = buffer.lent[inference]  # `Buffer.lend`'s usual case, without a call
    if fields is None or buffer.own_views or buffer.storage.data_ptr() != buffer.address:
        fields = buffer.lend(inference)
    else:
        buffer.lent_mode = inference
    bufs = tuple.__new__(adapter._held, fields if adapter._fields == 6 else fields[:3])
    bufs._buffer, bufs._token = buffer, handle._token  # what it fills (as views do)
    bufs._handle = handle  # from here on the tuple holds the buffer (an interrupt before:
    return bufs  # the handle's finaliser does)


def release(adapter: Any, bufs: object, event: CompletionEvent | None) -> None:
    """A compat adapter's ``release(bufs, event=...)`` (see ``compat._Adapter.release``)."""
    if type(bufs) is not adapter._held:  # (a copy or pickle of one is a public tuple)
        raise ReleaseError(adapter._refusal(bufs, False))
    handle = bufs._handle  # type: ignore[attr-defined]
    pool = handle._pool
    if pool is not adapter.pool:
        raise ReleaseError(adapter._refusal(bufs, False))
    if event is None and give_back(handle):
        return
    if event is not None:
        if not callable(getattr(event, "query", None)):
            raise TypeError(
                "release: event needs a query() -> bool method (torch.Event, "
                f"torch.cuda.Event), got {type(event).__name__}; the buffers stay acquired"
            )
        if owned():  # an event cannot be recorded inside a move
            raise reentered("release(bufs, event=...)")
    try:  # the handle's moves decide: of two releases of one tuple exactly one works
        if event is not None:
            handle.record_event(event)
        handle.__exit__(None, None, None)
    except ReleaseError as error:
        if isinstance(error.__cause__, InFlightReleaseWarning):
            raise  # released: too early (`_handle._early`)
        raise ReleaseError(adapter._refusal(bufs, True)) from None


def give_back(handle: BufferHandle) -> bool:
    """Release *handle* if the move is all it takes (`BufferHandle.__exit__`'s usual case).

    False: it takes more (events, a debug level, the caps); the caller releases it as usual.
    """
    buffer, token = handle._buffer, handle._token
    pool = handle._pool
    seen = buffer.recorded  # first: an event recorded after it makes the move refuse
    if token <= 0 or buffer.token != token or buffer.events or pool._watching or owned():
        return False
    views = (len(buffer.views) + buffer.lent_sets) * VIEW_SET_BYTES
    if not pool._ledger.give_back(buffer, token, None, views, seen):
        return False
    handle._token = 0
    if LATE:  # a finaliser that ran inside the move queued a release
        pool._drain()
    return True


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
