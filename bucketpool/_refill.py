"""The slow side of a hand-out: settling what waits, polling parked buffers, allocating.

`BucketPool.acquire` (and the compat adapters' acquire) first tries the ledger's `serve`
alone; this runs when it could not serve, and loops until it could.  Every step is one of
the ledger's moves or runs outside the lock.
"""

from __future__ import annotations

from typing import Protocol

from bucketpool._buffer import Bucket, Buffer, MakeHolder
from bucketpool._ledger import EMPTY, NEEDS_HOLDER, SETTLE, Ledger
from bucketpool._parking import poll


class _Pool(Protocol):
    """What this needs of its pool (a `bucketpool.BucketPool`)."""

    _ledger: Ledger

    def _drain(self, only: Bucket | None = None) -> None: ...
    def _new_buffer(self, bucket: Bucket, make: MakeHolder | None) -> Buffer: ...


__all__ = ["serve_slowly"]


def serve_slowly(
    pool: _Pool,
    bucket: Bucket,
    n: int,
    holder: object,
    code: object,
    lasti: int,
    make: MakeHolder | None,
    got: object,
) -> object:
    """Serve *holder* from *bucket* once the fast path could not: settle, poll, allocate.

    *got* is what the fast path's `Ledger.serve` returned.  Returns what `Ledger.serve`
    returns for a served hand-out.  *make* makes the tuples of a compat hand-out (None for
    a handle).
    """
    ledger = pool._ledger
    polled = False
    while True:
        if got is SETTLE:
            pool._drain(bucket)
        elif got is NEEDS_HOLDER and make is not None:
            top = bucket.free[-1:]  # a hint: attach_holder checks it again
            if top:
                ledger.attach_holder(top[0], *make(top[0], False))
        elif got is EMPTY:
            if not polled and (ledger.young or ledger.queues.old):
                polled = True
                retired, queued, found, index = poll(
                    ledger, bucket, take=make is None and ledger.plain
                )
                if found is not None:  # done, and of this bucket: handed out straight away
                    got = ledger.serve(bucket, n, holder, code, lasti, parked=found, index=index)
                    if got is not EMPTY:
                        return got
                if retired or found is not None:
                    if queued:  # retired into an inbox, not straight into the cache
                        pool._drain()
                    got = ledger.serve(bucket, n, holder, code, lasti)
                    continue
            fresh = pool._new_buffer(bucket, make)  # outside the lock: pinning can be slow
            return ledger.serve(bucket, n, holder, code, lasti, fresh)
        else:
            return got
        got = ledger.serve(bucket, n, holder, code, lasti)
