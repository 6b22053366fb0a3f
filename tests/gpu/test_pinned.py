"""Pinned pools: page-locked buffers, views and hand-outs, and memory back as on the CPU."""

from __future__ import annotations

import importlib

import pytest
import torch

import bucketpool.vllm
from bucketpool import BucketPool, PoolStats, _kv_offload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def life(pool: BucketPool, pinned: bool) -> list[PoolStats | int]:
    """Hand out, view, release, reuse, trim and empty *pool*, checking every tensor's pinning.

    Returns the stats at each stage and the bytes each trim freed.
    """
    stages: list[PoolStats | int] = []
    with pool.acquire(1000) as small, pool.acquire(5000) as large:
        for bufs in (small, large, small.shrink(10), large.shrink(4096)):
            assert [t.is_pinned() for t in bufs] == [pinned] * 3
        stages.append(pool.stats())
    after = pool.stats()
    assert after.allocated_bytes.current == 24 * (1024 + 8192)  # both cached, nothing freed
    assert after.active_bytes.current == 0
    stages.append(after)
    with pool.acquire(600) as again:  # the cached buffer of bucket 1024, new views
        assert [t.is_pinned() for t in (*again, *again.shrink(1))] == [pinned] * 6
    stages += [pool.stats(), pool.trim(24 * 8192), pool.stats(), pool.empty_cache()]
    emptied = pool.stats()
    assert (emptied.allocated_bytes.current, emptied.cached_bytes) == (0, 0)
    stages.append(emptied)
    return stages


def test_pinned_pools_hand_out_pinned_memory_and_give_it_back(summary: dict[str, str]) -> None:
    summary["pinned"] = "fail"
    pinned = life(BucketPool(pin_memory=True), pinned=True)
    assert pinned == life(BucketPool(), pinned=False)  # every count and byte as on the CPU
    assert pinned[3] != 0  # the trim freed a buffer
    summary["pinned"] = "pass"


def test_vllm_kv_offload_descriptors_come_pinned_from_the_pool() -> None:
    pytest.importorskip("vllm")
    gpu_worker = importlib.import_module("vllm.v1.kv_offload.cpu.gpu_worker")
    assert bucketpool.vllm.install(kv_offload=True).installed, "a vLLM bucketpool was tested with"
    try:
        triple = gpu_worker._new_descriptor_buffers(1000)
        assert [(t.numel(), t.is_pinned()) for t in triple] == [(1024, gpu_worker.PIN_MEMORY)] * 3
        _kv_offload._Returns().append(triple)  # what vLLM's handler does once the copy is done
    finally:
        bucketpool.vllm.uninstall()
