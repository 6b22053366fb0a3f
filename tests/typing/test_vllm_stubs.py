"""Static tests of the vLLM stubs in ``typings/`` and of bucketpool's fit with them.

Checked by mypy, never run (vLLM is not installed): every import of vLLM is under
``TYPE_CHECKING`` and all code sits inside ``check_*`` functions.
"""

from __future__ import annotations

import sys
import typing

import numpy as np
import torch

from bucketpool import BucketPool, DescriptorBuffers
from bucketpool.compat import AliasedDescriptorBufferPool, DescriptorBufferPool

if typing.TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import assert_type
    else:
        from typing_extensions import assert_type

    import vllm
    from vllm._custom_ops import swap_blocks_batch
    from vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker import (
        descriptor_buffers as canonical,
    )
    from vllm.distributed.ec_transfer.ec_connector.cpu.worker import (
        DescriptorBufferPool as WorkerDescriptorBufferPool,
    )
    from vllm.distributed.ec_transfer.ec_connector.cpu.worker import descriptor_buffers


def check_swap_blocks_batch(pool: BucketPool, n: int) -> None:
    with pool.acquire(n) as bufs:
        assert_type(swap_blocks_batch(*bufs), None)  # a DescriptorBuffers unpacks into it
        assert_type(swap_blocks_batch(bufs.src_ptrs, bufs.dst_ptrs, bufs.sizes, True), None)
        swap_blocks_batch(*bufs, is_src_access_order_any=True)
        swap_blocks_batch(bufs.src_ptrs, bufs.dst_ptrs)  # type: ignore[call-arg]
        swap_blocks_batch(*bufs, 1)  # type: ignore[arg-type]
    aliased = AliasedDescriptorBufferPool().acquire(n)
    swap_blocks_batch(aliased.src_ptrs, aliased.dst_ptrs, aliased.sizes)
    swap_blocks_batch(*aliased)  # type: ignore[arg-type, call-arg]  # six fields: pass the tensors
    swap_blocks_batch(aliased.src_np, aliased.dst_np, aliased.sizes_np)  # type: ignore[arg-type]
    compat = DescriptorBufferPool().acquire(n)
    swap_blocks_batch(compat.src_ptrs[:n], compat.dst_ptrs[:n], compat.sizes[:n])


def check_vllm_descriptor_buffers(n: int) -> None:
    assert_type(vllm.__version__, str)
    pool = descriptor_buffers.DescriptorBufferPool()
    bufs = pool.acquire(n)
    # Either shape: the three tensors are always there...
    assert_type(bufs.src_ptrs, torch.Tensor)
    assert_type(bufs.dst_ptrs, torch.Tensor)
    assert_type(bufs.sizes, torch.Tensor)
    fields = descriptor_buffers.DescriptorBuffers._fields
    assert_type(fields, tuple[str, str, str] | tuple[str, str, str, str, str, str])
    assert_type(pool.release(bufs), None)
    # ... the numpy aliases and add_copies only in the six-field shape.
    bufs.src_np  # type: ignore[union-attr]  # noqa: B018
    bufs.add_copies(0, np.array([1]), np.array([2]), np.array([8]))  # type: ignore[union-attr]
    pool.acquire("1")  # type: ignore[arg-type]
    pool.release(DescriptorBuffers(*bufs[:3]))  # type: ignore[arg-type]  # bucketpool's tuple
    descriptor_buffers.DescriptorBufferPool(torch.int64)  # type: ignore[call-arg]
    # The worker's re-exports and the canonical path are the same classes.
    assert_type(WorkerDescriptorBufferPool(), descriptor_buffers.DescriptorBufferPool)
    assert_type(canonical.DescriptorBufferPool(), descriptor_buffers.DescriptorBufferPool)
    descriptor_buffers.nope  # type: ignore[attr-defined]  # noqa: B018
