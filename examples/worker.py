"""The worker pattern: one pool per worker, one hand-out per step, descriptors filled in bulk.

Each step of this toy worker saves a few blocks of a block-structured cache into a staging
buffer and loads them back into other blocks, as vLLM's encoder-cache CPU worker moves
encoder outputs, with one batched copy each way.  The saves fill their descriptors with
``add_block_copies`` (block indices; runs of consecutive blocks become one descriptor), the
loads with ``add_copies`` (explicit addresses).  The copy op is bucketpool's host stand-in
for vLLM's ``swap_blocks_batch``, so the example runs without an accelerator, and every
byte is checked.

Run it as ``python examples/worker.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from bucketpool import BucketPool
from bucketpool.testing import swap_blocks_batch

BLOCK_BYTES = 256
NUM_BLOCKS = 64
STEPS = 200


def save(
    pool: BucketPool, cache: torch.Tensor, staging: torch.Tensor, blocks: Sequence[int]
) -> int:
    """Copy *blocks* of *cache* to the front of *staging*, in order; return descriptors used."""
    with pool.acquire(len(blocks)) as bufs:
        end = bufs.add_block_copies(
            0, cache.data_ptr(), staging.data_ptr(), blocks, range(len(blocks)), BLOCK_BYTES
        )
        swap_blocks_batch(*bufs.shrink(end))  # only the descriptors written
    return end


def load(
    pool: BucketPool, staging: torch.Tensor, cache: torch.Tensor, blocks: Sequence[int]
) -> int:
    """Copy the front of *staging* into *blocks* of *cache*; return descriptors used."""
    sources = [staging.data_ptr() + i * BLOCK_BYTES for i in range(len(blocks))]
    destinations = [cache.data_ptr() + block * BLOCK_BYTES for block in blocks]
    with pool.acquire(len(blocks)) as bufs:
        end = bufs.add_copies(0, sources, destinations, BLOCK_BYTES)
        swap_blocks_batch(*bufs.shrink(end))
    return end


def main() -> int:
    """Run the steps, check every byte moved, and print what the pool did."""
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    pool = BucketPool()  # thread-safe: one per worker, shared by its threads
    cache = torch.randint(
        0, 256, (NUM_BLOCKS * BLOCK_BYTES,), dtype=torch.uint8, generator=generator
    )
    staging = torch.zeros(NUM_BLOCKS * BLOCK_BYTES, dtype=torch.uint8)
    rows = cache.view(NUM_BLOCKS, BLOCK_BYTES)
    blocks_moved = descriptors = 0
    for _ in range(STEPS):
        count = rng.randint(1, NUM_BLOCKS // 2)
        if rng.random() < 0.5:  # a run of consecutive blocks: one descriptor
            start = rng.randrange(NUM_BLOCKS - count)
            blocks = list(range(start, start + count))
        else:
            blocks = rng.sample(range(NUM_BLOCKS), count)
        expected = rows[blocks].clone()
        descriptors += save(pool, cache, staging, blocks)
        if not torch.equal(staging[: count * BLOCK_BYTES].view(count, BLOCK_BYTES), expected):
            print("save: the staging buffer does not hold the blocks")
            return 1
        targets = rng.sample(range(NUM_BLOCKS), count)
        descriptors += load(pool, staging, cache, targets)
        if not torch.equal(rows[targets], expected):
            print("load: the cache does not hold the staged blocks")
            return 1
        blocks_moved += 2 * count
    stats = pool.stats()
    print(
        f"{STEPS} steps: {blocks_moved} blocks moved with {descriptors} descriptors, "
        "every byte checked"
    )
    print(
        f"pool: {stats.hits} hits, {stats.misses} misses, "
        f"{stats.allocations.current} buffers cached ({stats.cached_bytes:,} bytes), "
        f"{stats.active_requests.current} out, {stats.leaks} leaked"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
