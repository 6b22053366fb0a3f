"""The compat switch: code written for vLLM's ``DescriptorBufferPool`` runs on bucketpool.

`build_step` below is written against the original pool's API, as vLLM's EC CPU worker
uses it: ``acquire(n)``, three ``[:n]`` slices, ``release(bufs)``.  The only change is the
import.  The example then shows what the drop-in adds (a double release is refused, reuse
can wait for an event) and, where vLLM is installed, ``bucketpool.vllm.install()``, which
makes vLLM's own code use the drop-in without the import being changed; where it is not,
it says why (``.vllm/site``, where ``.ci/setup`` puts vLLM for the tests, is no install)
and how to install it.

Run it as ``python examples/compat_switch.py``.
"""

from __future__ import annotations

from pathlib import Path

import torch

import bucketpool.vllm
from bucketpool import ReleaseError

# from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
#     DescriptorBufferPool, DescriptorBuffers)
from bucketpool.compat import DescriptorBufferPool, DescriptorBuffers

#: Where the repository's `.ci/setup` installs vLLM's wheel for the tests, on no path.
SETUP_SITE = Path(__file__).resolve().parent.parent / ".vllm" / "site"


def build_step(pool: DescriptorBufferPool, copies: list[tuple[int, int, int]]) -> DescriptorBuffers:
    """Fill descriptors for *copies* the way the original's callers do; return the triple."""
    n = len(copies)
    bufs = pool.acquire(n)
    assert n <= bufs.src_ptrs.numel()  # the original promises capacity >= n, no more
    src, dst, sizes = bufs.src_ptrs[:n], bufs.dst_ptrs[:n], bufs.sizes[:n]
    src.copy_(torch.tensor([c[0] for c in copies]))
    dst.copy_(torch.tensor([c[1] for c in copies]))
    sizes.copy_(torch.tensor([c[2] for c in copies]))
    # swap_blocks_batch(src, dst, sizes) would run here
    return bufs


class Done:
    """A copy's end event that has finished (a ``torch.cuda.Event`` on a GPU)."""

    def query(self) -> bool:
        """Return True: the copy is done."""
        return True


def main() -> int:
    """Drive the drop-in as the original's callers do, then try the vLLM switch."""
    pool = DescriptorBufferPool()
    copies = [(0x1000 + 64 * i, 0x9000 + 64 * i, 64) for i in range(5)]

    bufs = build_step(pool, copies)
    print(f"acquire(5) gave a triple of capacity {bufs.src_ptrs.numel()}")
    pool.release(bufs)
    try:
        pool.release(bufs)
    except ReleaseError as error:
        print(f"a second release is refused: {error}")

    bufs = build_step(pool, copies)
    pool.release(bufs, event=Done())  # reuse waits until event.query() is true
    print(f"backed by {pool.pool!r}: {pool.pool.stats().allocations.current} buffer allocated")

    try:
        bucketpool.vllm.install()
    except ImportError as error:
        print("vLLM is not installed here: bucketpool.vllm.install() needs it")
        if (SETUP_SITE / "vllm").is_dir():
            print(
                ".vllm/site does not count: .ci/setup installs vLLM's wheel there for the "
                "tests only, without its dependencies, and no sys.path entry leads to it"
            )
        print(f"install() said how to install it: {error}")
    else:
        print(f"bucketpool.vllm.install(): installed() is {bucketpool.vllm.installed()}")
        bucketpool.vllm.uninstall()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
