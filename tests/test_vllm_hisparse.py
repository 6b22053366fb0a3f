"""vLLM's HiSparse spill, filled through a pool: interleaved fills and an event per batch.

vLLM's ``HiSparseConnectorWorker._enqueue_transfers`` (0.33.0's and 0.34.0's alike) lays one
descriptor per transfer and layer out interleaved (entry ``transfer * num_layers + layer``),
writing each layer's column with ``descriptors.src_np[slice(layer, count, num_layers)] =
...``, and keeps ``(event, descriptors)`` pairs in a list it polls by hand.  Here the real
method (loaded from the wheel, its imports stood in for: it runs no other vLLM code) fills
vLLM's own descriptors, and the same spill is filled through ``bufs.add_copies(layer, ...,
step=num_layers)``; every entry must agree.  ``bufs.record_event`` replaces the hand-kept
list.  It runs for each vLLM found (see ``_vllm_standin``); skipped where none has a
HiSparse worker.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import _vllm_standin as standin
import numpy as np
import pytest
import torch
from _events import FlagEvent

from bucketpool import BucketPool, DescriptorBuffers
from bucketpool.testing import swap_blocks_batch

WORKER = "distributed/kv_transfer/kv_connector/v1/hisparse/worker.py"
#: What the worker imports from vLLM: modules whose every attribute is a bare class.
IMPORTS = (
    "vllm",
    "vllm.config",
    "vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats",
    "vllm.distributed.parallel_state",
    "vllm.utils.gpu_sync_debug",
    "vllm.utils.torch_utils",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.hisparse.backend",
    "vllm.v1.hisparse.binding",
    "vllm.v1.hisparse.layout",
    "vllm.v1.hisparse.runtime",
    "vllm.v1.hisparse.types",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.utils",
)
KERNEL_BLOCK_SIZE = 4  # rows per page
SOURCE_INDICES = (0, 2, 1, 1, 0)  # each layer's resident source (vLLM: per cache handle)
WIDTHS = (8, 8, 16, 4, 8)  # each layer's row, in 2-byte values: sizes differ by layer


class _Stand(types.ModuleType):
    """A module standing in for one the worker imports: any name is a bare class."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


@pytest.fixture(params=standin.site_params())
def hisparse(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """vLLM's HiSparse worker module, loaded alone from each vLLM found (undone afterwards)."""
    locations = standin.vllm_locations(request.param)
    path = Path(locations[0]) / WORKER if locations else None
    if path is None or not path.exists():
        pytest.skip("no vLLM with a HiSparse worker: run .ci/setup (docs/development.md)")
    for name in IMPORTS:
        monkeypatch.setitem(sys.modules, name, _Stand(name))
    spec = importlib.util.spec_from_file_location("_hisparse_worker", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def make_worker(hisparse: types.ModuleType, rng: np.random.Generator) -> Any:
    """The state ``_enqueue_transfers`` reads, on host tensors; its submission records."""
    caches = [
        torch.from_numpy(rng.integers(-(2**15), 2**15, (6, KERNEL_BLOCK_SIZE, w), dtype=np.int16))
        for w in WIDTHS
    ]
    worker = types.SimpleNamespace(
        is_host_writer=True,
        kernel_block_size=KERNEL_BLOCK_SIZE,
        cache_handles=[
            types.SimpleNamespace(runtime=types.SimpleNamespace(resident_source_index=i))
            for i in SOURCE_INDICES
        ],
        resident_caches=caches,
        host_caches=[torch.zeros((8 * KERNEL_BLOCK_SIZE, w), dtype=torch.int16) for w in WIDTHS],
        _acquire_dma_descriptors=hisparse._allocate_dma_descriptors,
        submitted=[],
    )
    worker._submit_dma_descriptors = lambda descriptors, count, **_: worker.submitted.append(
        (descriptors, count)
    )
    return worker


def make_transfers(rng: np.random.Generator, count: int) -> list[Any]:
    return [
        types.SimpleNamespace(
            transfer_id=i,
            host_block_id=int(host),
            resident_block_ids=tuple(int(b) for b in rng.integers(0, 6, 3)),
        )
        for i, host in enumerate(rng.permutation(8)[:count])
    ]


def fill_spill(bufs: DescriptorBuffers, worker: Any, transfers: list[Any]) -> int:
    """``_enqueue_transfers``' descriptors, one interleaved fill per layer; return the count."""
    num_layers = len(worker.cache_handles)
    rows = np.array([t.host_block_id * KERNEL_BLOCK_SIZE for t in transfers], dtype=np.int64)
    blocks = np.array([t.resident_block_ids for t in transfers], dtype=np.int64)
    end = 0
    for layer, handle in enumerate(worker.cache_handles):
        source, host = worker.resident_caches[layer], worker.host_caches[layer]
        row_bytes = source.shape[-1] * source.element_size()
        end = bufs.add_copies(
            layer,
            source.data_ptr()
            + blocks[:, handle.runtime.resident_source_index]
            * source.stride(0)
            * source.element_size(),
            host.data_ptr() + rows * row_bytes,
            KERNEL_BLOCK_SIZE * row_bytes,
            step=num_layers,
        )
    return end


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_interleaved_fills_write_what_vllms_slices_write(
    hisparse: types.ModuleType, dtype: torch.dtype, count: int
) -> None:
    rng = np.random.default_rng(count)
    worker, transfers = make_worker(hisparse, rng), make_transfers(rng, count)
    hisparse.HiSparseConnectorWorker._enqueue_transfers(worker, transfers)
    [(theirs, their_count)] = worker.submitted
    assert their_count == count * len(WIDTHS)
    with BucketPool(dtype=dtype).acquire(their_count + 3) as bufs:
        end = fill_spill(bufs, worker, transfers)
        assert end == their_count  # the last layer's fill returns the batch's count
        ours = bufs.shrink(end)
        for mine, vllms in zip(ours, (theirs.src, theirs.dst, theirs.sizes), strict=True):
            assert mine.view(torch.int64).tolist() == vllms[:their_count].tolist()
        swap_blocks_batch(*ours)
    for layer, handle in enumerate(worker.cache_handles):
        for transfer in transfers:
            block = transfer.resident_block_ids[handle.runtime.resident_source_index]
            row = transfer.host_block_id * KERNEL_BLOCK_SIZE
            host = worker.host_caches[layer][row : row + KERNEL_BLOCK_SIZE]
            assert torch.equal(host, worker.resident_caches[layer][block])


def test_the_event_replaces_the_hand_kept_in_flight_list(hisparse: types.ModuleType) -> None:
    # vLLM appends (event, descriptors) and pops them when event.query() says done; here
    # each spill records its event and the pool keeps the buffer from reuse until then.
    rng = np.random.default_rng(7)
    pool, worker = BucketPool(), make_worker(hisparse, rng)
    events, addresses = [FlagEvent(), FlagEvent()], []
    for event in events:
        transfers = make_transfers(rng, 3)
        with pool.acquire(len(transfers) * len(WIDTHS)) as bufs:
            swap_blocks_batch(*bufs.shrink(fill_spill(bufs, worker, transfers)))
            bufs.record_event(event)
        addresses.append(bufs.src_ptrs.data_ptr())
    assert addresses[0] != addresses[1]  # the first spill's buffer was still in flight
    events[0].done = True
    with pool.acquire(3 * len(WIDTHS)) as bufs:
        assert bufs.src_ptrs.data_ptr() == addresses[0]  # its copy done: reused
