"""Helpers for users' tests of code that builds descriptors (``import bucketpool.testing``)."""

from __future__ import annotations

import ctypes
import typing
from collections.abc import Callable

import numpy as np
import torch

from bucketpool import _copies

if typing.TYPE_CHECKING:
    from bucketpool._pool import BucketPool

__all__ = ["HostDevice", "HostEvent", "assert_no_outstanding", "swap_blocks_batch"]


def assert_no_outstanding(pool: BucketPool) -> None:
    """Fail if *pool* has buffers handed out and not released, listing each.

    Sites are known when the pool traces (``trace=True`` or a debug level).

    Raises:
        AssertionError: buffers are still out; the message lists them.
    """
    records = pool.outstanding()
    if not records:
        return
    where = "<unknown: use debug=checks or trace=True to record sites>"
    lines = [f"{len(records)} buffer(s) still out of {pool!r}:"]
    lines.extend(
        f"  n={r.n} (capacity {r.capacity}) acquired at {r.acquired_at or where}" for r in records
    )
    raise AssertionError("\n".join(lines))


def swap_blocks_batch(
    src_ptrs: torch.Tensor,
    dst_ptrs: torch.Tensor,
    sizes: torch.Tensor,
    *,
    device: HostDevice | None = None,
) -> None:
    """Copy ``sizes[i]`` bytes from ``src_ptrs[i]`` to ``dst_ptrs[i]`` for every *i*, on the host.

    A reference of vLLM's op for tests without an accelerator: all checks (the op's, contiguity,
    null addresses, negative sizes) come first, then the copies, in order, each a ``memmove`` of
    descriptors read beforehand (int64 addresses as uint64 bits).  A bad address crashes.
    With *device*, the copy is queued there instead (`HostDevice.swap_blocks_batch`).

    Args:
        src_ptrs: source addresses, one per copy.
        dst_ptrs: destination addresses, one per copy.
        sizes: byte counts, one per copy, each in 0..2**63-1.
        device: a `HostDevice` whose copies run later, or `None`: copy now.

    Raises:
        TypeError: an argument is not a tensor, is not on the CPU, is not int64 or uint64,
            or the three dtypes differ.
        ValueError: a tensor is not 1-D or not contiguous; the lengths differ; an address
            is 0 (null); a size is negative (for uint64 sizes: 2**63 or more).
    """
    if device is not None:
        device.swap_blocks_batch(src_ptrs, dst_ptrs, sizes)
        return
    tensors = {"src_ptrs": src_ptrs, "dst_ptrs": dst_ptrs, "sizes": sizes}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise TypeError(
                f"{name} is on {tensor.device}; swap_blocks_batch reads descriptors on the "
                f"host, so pass CPU tensors ({name}.cpu())"
            )
        if tensor.dtype not in (torch.int64, torch.uint64):
            raise TypeError(f"{name} must be int64 or uint64, got {tensor.dtype}")
    if not src_ptrs.dtype == dst_ptrs.dtype == sizes.dtype:
        raise TypeError(
            "src_ptrs, dst_ptrs and sizes must share one dtype, got "
            f"{src_ptrs.dtype}, {dst_ptrs.dtype} and {sizes.dtype}"
        )
    for name, tensor in tensors.items():
        if tensor.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
        if not tensor.is_contiguous():
            raise ValueError(
                f"{name} is not contiguous (stride {tensor.stride()}); the op reads n values "
                f"from its data pointer, so pass a contiguous slice such as buf[:n]"
            )
    n = src_ptrs.numel()
    if dst_ptrs.numel() != n or sizes.numel() != n:
        raise ValueError(
            "src_ptrs, dst_ptrs and sizes must have one length, got "
            f"{n}, {dst_ptrs.numel()} and {sizes.numel()}"
        )
    if n == 0:
        return
    # Copied: the checks and the copies see the same values, whatever the copies overwrite.
    src, dst = (p.numpy().view(np.uint64).copy() for p in (src_ptrs, dst_ptrs))
    counts = sizes.numpy().view(np.int64).copy()
    for name, addresses in (("src_ptrs", src), ("dst_ptrs", dst)):
        if not addresses.all():
            i = int(np.flatnonzero(addresses == 0)[0])
            raise ValueError(f"{name}[{i}] is 0, a null address; nothing was copied")
    if counts.min() < 0:
        i = int(np.flatnonzero(counts < 0)[0])
        raise ValueError(
            f"sizes[{i}] = {int(sizes.numpy()[i])} is not a byte count in 0..2**63-1; "
            "nothing was copied"
        )
    for source, destination, count in zip(src.tolist(), dst.tolist(), counts.tolist(), strict=True):
        ctypes.memmove(destination, source, count)


@typing.final
class HostEvent:
    """An event of a `HostDevice`: done once every copy queued before it was recorded has run."""

    def __init__(self, device: HostDevice, position: int) -> None:
        self._device, self._position = device, position

    def query(self) -> bool:
        """Return whether the copies before it have run."""
        return self._device.done >= self._position

    def synchronize(self) -> None:
        """Run the copies before it."""
        self._device.run_to(self._position)


@typing.final
class HostDevice:
    """A stand-in accelerator for tests: copies run later, in order, as a GPU runs them.

    `swap_blocks_batch` queues a copy and returns; the copy reads its descriptors when it
    runs (`run`, `drain`, or a later event's ``synchronize()``), so code that gives a
    descriptor buffer back, or rewrites it, before its copy ran makes it copy the wrong
    bytes, as on a device.  Each copy's end event is also recorded on the pool's hand-out
    its descriptors belong to: a pool keeps a buffer released too early out of reuse until
    its copy ran, and at ``debug="checks"`` warns (`bucketpool.InFlightReleaseWarning`)
    naming both lines.  Not thread-safe: one thread queues and runs.
    """

    def __init__(self) -> None:
        self._queue: list[Callable[[], None] | None] = []
        self._done = 0
        self._recorded = _copies.recording(self._queue_copy, self.event, self.drain)  # install()'s

    @property
    def submitted(self) -> int:
        """How many copies were queued."""
        return len(self._queue)

    @property
    def done(self) -> int:
        """How many of them have run."""
        return self._done

    def event(self) -> HostEvent:
        """Return an event recorded now: done once every copy queued so far has run."""
        return HostEvent(self, len(self._queue))

    def swap_blocks_batch(
        self, src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor
    ) -> HostEvent:
        """Queue the copies of `swap_blocks_batch`; return the copy's end event.

        The arguments are checked when the copy runs, as they are read then.
        """
        return self._recorded(src_ptrs, dst_ptrs, sizes)

    def _queue_copy(
        self, src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor
    ) -> HostEvent:
        # The device reads the memory, whatever becomes of the views (strict's end with it).
        src, dst, size = (
            tensor.as_subclass(torch.Tensor) for tensor in (src_ptrs, dst_ptrs, sizes)
        )
        self._queue.append(lambda: swap_blocks_batch(src, dst, size))
        return self.event()

    def run_to(self, position: int) -> None:
        """Run the queued copies before *position*, in order."""
        while self._done < min(position, len(self._queue)):
            work = self._queue[self._done]
            self._queue[self._done] = None  # let go of the tensors it holds
            self._done += 1
            if work is not None:
                work()

    def run(self, count: int = 1) -> None:
        """Run the next *count* queued copies (fewer if fewer are queued)."""
        self.run_to(self._done + count)

    def drain(self) -> None:
        """Run every queued copy."""
        self.run_to(len(self._queue))
