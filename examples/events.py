"""Events and parking: a buffer whose copy may still be running is not handed out again.

On a GPU the event is a ``torch.cuda.Event`` recorded after ``swap_blocks_batch``; here a
`FakeEvent` stands in for it (anything with ``query() -> bool`` will do), and the example
says when each "copy" finishes.  It shows a release that parks, a parked buffer coming back
once its event is done, events completing out of order, an event that never completes
holding back nothing but its own buffer, and ``synchronize()`` at shutdown.

Run it as ``python examples/events.py``.
"""

from __future__ import annotations

from bucketpool import BucketPool

N = 1196


class FakeEvent:
    """A copy's end event whose completion the example decides."""

    def __init__(self) -> None:
        """Start pending."""
        self.done = False

    def query(self) -> bool:
        """Return whether the copy has finished (what ``torch.cuda.Event.query`` says)."""
        return self.done

    def synchronize(self) -> None:
        """Wait for the copy: here it finishes at once (``BucketPool.synchronize`` calls this)."""
        self.done = True


def copy_step(pool: BucketPool) -> FakeEvent:
    """Fill a buffer, "launch" its copy, record the copy's end event, and release."""
    event = FakeEvent()
    handle = pool.acquire(N)
    with handle as bufs:
        bufs.add_copies(0, range(0, N * 64, 64), range(1 << 20, (1 << 20) + N * 64, 64), 64)
        # swap_blocks_batch(*bufs) would enqueue the copies here; then, on a GPU:
        # event = torch.cuda.Event(); event.record()
        handle.record_event(event)
    return event  # the with block released the handle: the buffer is parked


def show(pool: BucketPool, what: str) -> None:
    """Print the pool's parked and allocated buffers after *what*."""
    stats = pool.stats()
    print(f"{what}: {stats.parked} parked, {stats.allocations.current} allocated")


def main() -> int:
    """Walk through parking, out-of-order completion, a stuck event and shutdown."""
    pool = BucketPool()

    first = copy_step(pool)
    show(pool, "one copy in flight")
    second = copy_step(pool)  # the first buffer is parked: this one is new
    show(pool, "two copies in flight")

    first.done = True
    second.done = True
    print(f"collect() retired {pool.collect()}")
    copy_step(pool).done = True  # reuses a retired buffer: nothing new is allocated
    show(pool, "after a third step")
    print(f"collect() retired {pool.collect()}")

    events = [copy_step(pool) for _ in range(3)]
    events[2].done = True  # the newest copy finishes first
    print(f"out of order: collect() retired {pool.collect()} (the newest)")
    events[0].done = events[1].done = True
    print(f"collect() retired {pool.collect()} (the other two)")

    stuck = copy_step(pool)  # an event that never completes: a hung copy
    for _ in range(10):
        copy_step(pool).done = True
    show(pool, "ten steps after a stuck copy")

    pool.synchronize()  # shutdown: waits on every parked buffer (stuck.synchronize())
    show(pool, "after synchronize()")
    return 0 if stuck.done and pool.stats().parked == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
