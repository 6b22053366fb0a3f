"""``install(kv_offload=True)``: vLLM's real KV-offload handlers on bucketpool's pool.

Runs for each ``vllm`` package found (as ``test_vllm_real.py``: 0.34.0 and 0.33.0 after
``.ci/setup``), over the host KV stand-in of ``bench/_vllm_host.py``: copies are queued and
run in order only when the test advances the device, and each reads its descriptors when it
runs, as a GPU does, so a buffer reused while its copy is queued changes what the copy
moves.  Every trace is checked
byte for byte against a model, with vLLM's own list and with the drop-in, under
``torch.inference_mode()`` (vLLM's ``execute_model`` runs the transfers in it).
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import importlib
import logging
import pickle
import random
import sys
import types
import typing
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _vllm_standin as standin
import numpy as np
import numpy.typing as npt
import pytest
import torch
from _events import FlagEvent

from bucketpool import (
    BucketPool,
    LeakWarning,
    ReleaseError,
    _kv_offload,
    orphaned_buffers,
)
from bucketpool import vllm as bucketpool_vllm

PAGES = (48, 64)  # bytes per device block of each KV tensor
WRAPPED = ("transfer_async", "get_finished", "shutdown")  # what install wraps in a handler
DEVICE_BLOCKS = 32
HOST_CHUNKS = 24


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] in ("vllm", "vllm_ascend")}


@pytest.fixture(params=standin.site_params())
def vllm_site(request: pytest.FixtureRequest) -> Path:
    """Each vLLM found, the newest first."""
    return typing.cast("Path", request.param)


@pytest.fixture(params=[False, True], ids=["int64", "xpu-uint64"])
def gpu_worker(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, vllm_site: Path
) -> Iterator[types.ModuleType]:
    """vLLM's real ``gpu_worker`` over the stand-in; everything is undone afterwards."""
    before = _vllm_names()
    for name in ("BUCKETPOOL_CONF", "BUCKETPOOL_DEBUG"):  # the pools install makes: defaults
        monkeypatch.delenv(name, raising=False)
    standin.install_kv_standin(monkeypatch, eager=False, xpu=request.param, site=vllm_site)
    try:
        yield importlib.import_module(standin.KV_WORKER)
    finally:
        bucketpool_vllm.uninstall()
        for name in _vllm_names() - before:
            sys.modules.pop(name, None)


def _leaks(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(each.message) for each in record if issubclass(each.category, LeakWarning)]


def base() -> Any:
    return sys.modules["vllm.v1.kv_offload.base"]


def make_worker(module: types.ModuleType, blocks_per_chunk: int = 1) -> Any:
    """A CPUOffloadingWorker over two device tensors of different page sizes, one group.

    The caches it was made over are its ``test_caches`` (`specs` and `device_pages` read them).
    """
    b = base()
    tensors = [
        b.CanonicalKVCacheTensor(
            tensor=standin.device_tensor(DEVICE_BLOCKS, page), page_size_bytes=page
        )
        for page in PAGES
    ]
    refs = [[b.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=p) for i, p in enumerate(PAGES)]]
    caches = b.CanonicalKVCaches(tensors=tensors, group_data_refs=refs)
    worker = module.CPUOffloadingWorker(
        kv_caches=caches, blocks_per_chunk=blocks_per_chunk, num_cpu_chunks=HOST_CHUNKS
    )
    worker.test_caches = caches
    return worker


def specs(worker: Any, blocks: list[int], chunks: list[int]) -> tuple[Any, Any]:
    """A transfer's device side and CPU spec, as *worker*'s vLLM takes them.

    Store: ``submit_store(job, *specs(...))``; load: ``submit_load(job, cpu, device)``.  The
    device side is a ``GPULoadStoreSpec`` up to vLLM 0.33, its ``DevicePointers`` (resolved
    by ``pointer_utils``, as vLLM's connector does) from 0.34.
    """
    common = importlib.import_module("vllm.v1.kv_offload.cpu.common")
    gpu = base().GPULoadStoreSpec(blocks, group_sizes=(len(blocks),), block_indices=(0,))
    if hasattr(base(), "DevicePointers"):
        pointers = importlib.import_module("vllm.v1.kv_offload.pointer_utils")
        gpu = pointers.resolve_device_pointers(gpu, worker.test_caches)
    return gpu, common.CPULoadStoreSpec(chunks)


def device_pages(worker: Any) -> list[torch.Tensor]:
    """The device tensors *worker* copies from and to (`make_worker`'s)."""
    return [each.tensor for each in worker.test_caches.tensors]


def host_pages(worker: Any) -> list[torch.Tensor]:
    """The host tensors *worker* copies to and from (one list per handler up to vLLM 0.33)."""
    store = worker._store_handler
    return list(store.cpu_tensors if hasattr(store, "cpu_tensors") else store.dst_tensors)


def pages(tensor: torch.Tensor, page: int) -> npt.NDArray[np.uint8]:
    """A tensor's bytes as rows of one device page (host chunks hold several)."""
    return torch.Tensor.numpy(tensor.as_subclass(torch.Tensor).view(torch.uint8)).reshape(-1, page)


def run_trace(module: types.ModuleType, seed: int, steps: int, blocks_per_chunk: int) -> int:
    """Drive a worker through random stores and loads, 1-3 in flight; check every byte.

    Returns how many transfers were submitted.  Each step submits one transfer, lets 0-2
    queued copies run (at most three stay queued), asks ``get_finished()``, and compares
    every device and host byte with a model that applies each transfer when it runs.
    """
    rng = random.Random(seed)
    device = standin.device()
    worker = make_worker(module, blocks_per_chunk)
    gpu = [pages(t, p) for t, p in zip(device_pages(worker), PAGES, strict=True)]
    host = [pages(t, p) for t, p in zip(host_pages(worker), PAGES, strict=True)]
    for array in (*gpu, *host):
        array[:] = np.frombuffer(rng.randbytes(array.size), np.uint8).reshape(array.shape)
    model = [[a.copy() for a in gpu], [a.copy() for a in host]]
    queued: list[tuple[int, list[int], list[int]]] = []  # (to host?, from rows, to rows)
    finished: list[int] = []
    try:
        with torch.inference_mode():
            for job in range(steps + 3):  # the last three only let the copies run
                if job < steps:
                    chunks = rng.sample(range(HOST_CHUNKS), rng.randint(1, 4))
                    blocks = rng.sample(range(DEVICE_BLOCKS), len(chunks) * blocks_per_chunk)
                    rows = [
                        c * blocks_per_chunk + i for c in chunks for i in range(blocks_per_chunk)
                    ]
                    gpu_spec, cpu_spec = specs(worker, blocks, chunks)
                    if rng.random() < 0.5:
                        assert worker.submit_store(job, gpu_spec, cpu_spec)
                        queued.append((1, blocks, rows))
                    else:
                        assert worker.submit_load(job, cpu_spec, gpu_spec)
                        queued.append((0, rows, blocks))
                device.advance(rng.randint(0, 2) if job < steps else 1)
                device.advance(device.submitted - device.done - 3)
                for to_host, sources, targets in queued[: device.done - len(finished)]:
                    for src, dst in zip(model[1 - to_host], model[to_host], strict=True):
                        dst[targets] = src[sources]
                del queued[: device.done - len(finished)]
                finished += [result.job_id for result in worker.get_finished()]
                assert len(finished) == device.done
                for actual, expected in zip((*gpu, *host), (*model[0], *model[1]), strict=True):
                    np.testing.assert_array_equal(actual, expected)
        assert sorted(finished) == list(range(steps))  # stores are reported before loads
    finally:
        device.drain()
        worker.shutdown()
    return steps


@pytest.mark.parametrize("blocks_per_chunk", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("install", [False, True], ids=["vllm-list", "installed"])
def test_random_trace_is_byte_exact(
    gpu_worker: types.ModuleType, install: bool, seed: int, blocks_per_chunk: int
) -> None:
    if install:
        bucketpool_vllm.install(kv_offload=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        run_trace(gpu_worker, seed, steps=60, blocks_per_chunk=blocks_per_chunk)
        gc.collect()
    if install:
        (pool,) = _kv_offload._pools.values()
        stats = pool.stats()
        assert stats.active_requests.current == 0
        assert stats.parked == 0
        assert stats.hits > stats.misses  # served from the pool, not made per transfer


def test_a_buffer_reused_in_flight_is_caught(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trace can fail: a drop-in giving a buffer back at hand-out corrupts the bytes."""

    def broken(pool: BucketPool, n: int) -> tuple[torch.Tensor, ...]:
        handle = pool.acquire(pool.bucket_capacity(n))
        triple = tuple(view.detach() for view in handle.buffers)
        handle.release()  # too early: the copy has not run
        return triple

    monkeypatch.setattr(_kv_offload, "_descriptors", broken)
    bucketpool_vllm.install(kv_offload=True)
    with pytest.raises(AssertionError, match="Arrays are not equal"):
        run_trace(gpu_worker, seed=0, steps=60, blocks_per_chunk=1)


def pool_of(module: types.ModuleType) -> BucketPool:
    factory = module._new_descriptor_buffers
    assert isinstance(factory, functools.partial)
    pool = factory.args[0]
    assert isinstance(pool, BucketPool)
    return pool


HOLDERS: dict[str, Any] = {  # what a caller may keep of a triple: each holds the hand-out
    "a slice": lambda tensor: tensor[:20],
    "a view": lambda tensor: tensor.view(4, 8),
    "its numpy array": lambda tensor: tensor.numpy(),
    "a slice's numpy array": lambda tensor: tensor[3:9].numpy(),
}


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
@pytest.mark.parametrize("keep", HOLDERS.values(), ids=HOLDERS.keys())
@pytest.mark.parametrize("inference", [False, True], ids=["default-mode", "inference-mode"])
def test_a_dropped_triple_warns_and_comes_back(
    gpu_worker: types.ModuleType,
    inference: bool,
    keep: Any,
    level: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 33: at strict a slice of a triple did not hold the hand-out (the hold sat on the
    # strict alias, a slice's base was the plain tensor under it): a false LeakWarning, and
    # the next transfer got the buffer the slice still pointed at.  The tensors are made
    # over numpy arrays that carry the hold, so whatever shares their memory holds it, at
    # every level and also under inference mode (where a view keeps no link to its base).
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)
    bucketpool_vllm.install(kv_offload=True)
    pool = pool_of(gpu_worker)
    with torch.inference_mode(inference):
        triple = gpu_worker._new_descriptor_buffers(20)
        assert [t.numel() for t in triple] == [32] * 3
        kept = keep(triple[1])
        del triple
        assert len(pool.outstanding()) == 1  # held by what was kept
        other = gpu_worker._new_descriptor_buffers(20)  # so another buffer, not the kept one
        assert len(pool.outstanding()) == 2
        _kv_offload._Returns().append(other)
        with pytest.warns(LeakWarning, match="n=32 was never released"):
            del kept  # the last of it: at once, without the collector
    assert pool.outstanding() == []
    assert pool.stats().leaks == 1


def test_shutdown_gives_back_what_it_synchronised(gpu_worker: types.ModuleType) -> None:
    bucketpool_vllm.install(kv_offload=True)
    worker = make_worker(gpu_worker)
    with torch.inference_mode():
        for job in range(3):
            assert worker.submit_store(job, *specs(worker, [job], [job]))
    pool = pool_of(gpu_worker)
    assert pool.stats().active_requests.current == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        worker.shutdown()  # vLLM synchronises each end event, then drops the transfers
        gc.collect()
    stats = pool.stats()
    assert stats.active_requests.current == 0
    assert stats.parked == 0
    assert stats.leaks == 0


def test_a_failed_synchronize_keeps_in_flight_buffers_out_of_reuse(
    gpu_worker: types.ModuleType,
) -> None:
    bucketpool_vllm.install(kv_offload=True)
    worker = make_worker(gpu_worker)
    handler = worker._store_handler
    with torch.inference_mode():
        for job in range(2):
            assert handler.transfer_async(job, *specs(worker, [job], [job]))
    in_flight = {transfer.batch_src.data_ptr() for transfer in handler._transfers}
    kept = [*device_pages(worker), *host_pages(worker)]  # shutdown drops them; copies write

    def device_lost() -> None:
        raise RuntimeError("device lost")

    handler._transfers[0].end_event.synchronize = device_lost
    with pytest.raises(RuntimeError, match="device lost"):
        handler.shutdown()
    assert not handler._transfers
    assert not handler._buffer_pool
    pool = pool_of(gpu_worker)
    assert pool.stats().parked == 2
    assert pool.outstanding() == []
    again = [gpu_worker._new_descriptor_buffers(1) for _ in range(2)]
    assert not in_flight & {triple[0].data_ptr() for triple in again}
    standin.device().drain()  # the copies ran after all
    del kept
    assert pool.collect() == 2
    returns = _kv_offload._Returns()
    for triple in again:
        returns.append(triple)
    assert pool.outstanding() == []
    assert pool.stats().leaks == 0


def _copy_fails(*args: object, **kwargs: object) -> None:
    raise RuntimeError("copy failed")  # vLLM 0.34 catches a RuntimeError of the copy


def _device_lost() -> bool:
    raise RuntimeError("device lost")


def _failing(module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip before vLLM 0.34; else silence the worker's log of a failure.

    vLLM logs each failure with ``logger.exception``: a record holding the traceback, whose
    frames hold the failed transfer's triple for as long as a handler keeps the record
    (pytest's do, to the end of the test).
    """
    if "failed" not in getattr(module.Transfer, "__dataclass_fields__", {}):
        pytest.skip("this vLLM (before 0.34) has no failed transfers: an error propagates")
    monkeypatch.setattr(logging.getLogger(module.__name__), "disabled", True)


def test_a_failed_copy_gives_its_triple_back_when_vllm_drops_it(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34 keeps a transfer whose copy raised until its end event is done, then drops
    its triple: the triple comes back then, at once, and no LeakWarning names vLLM's line.

    vLLM records the end event after the failed copy, on the transfer's stream: it is done
    once the copies queued before have run (and whatever part of this one was queued).
    """
    _failing(gpu_worker, monkeypatch)
    bucketpool_vllm.install(kv_offload=True)
    pool = pool_of(gpu_worker)
    worker = make_worker(gpu_worker)
    handler = worker._store_handler
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.inference_mode():
            assert handler.transfer_async(0, *specs(worker, [0], [0]))  # queued, not run
            copy, handler._swap_blocks_batch = handler._swap_blocks_batch, _copy_fails
            assert handler.transfer_async(1, *specs(worker, [1], [1]))  # failed, logged
            handler._swap_blocks_batch = copy
        assert [transfer.failed for transfer in handler._transfers] == [False, True]
        failed = handler._transfers[1].batch_src.data_ptr()
        assert handler.get_finished() == []  # its end event waits for copy 0
        assert len(pool.outstanding()) == 2  # vLLM holds it: not reusable
        standin.device().drain()
        assert [(r.job_id, r.success) for r in handler.get_finished()] == [(0, True), (1, False)]
        gc.collect()
        stats = pool.stats()
        assert (stats.active_requests.current, stats.parked) == (0, 0)  # back at once
        again = [gpu_worker._new_descriptor_buffers(1) for _ in range(2)]
        assert failed in {triple[0].data_ptr() for triple in again}  # reused
        returns = _kv_offload._Returns()
        for triple in again:
            returns.append(triple)
        worker.shutdown()
    assert _leaks(record) == []
    assert pool.stats().leaks == 0
    assert pool.outstanding() == []


def test_a_dropped_triple_comes_back_when_get_finished_raises_after(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error vLLM lets out of ``get_finished`` (one not a RuntimeError) loses the results
    of the transfers it dropped before: their triples come back all the same."""
    _failing(gpu_worker, monkeypatch)
    bucketpool_vllm.install(kv_offload=True)
    pool = pool_of(gpu_worker)
    worker = make_worker(gpu_worker)
    handler = worker._store_handler
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.inference_mode():
            copy, handler._swap_blocks_batch = handler._swap_blocks_batch, _copy_fails
            assert handler.transfer_async(0, *specs(worker, [0], [0]))  # failed
            handler._swap_blocks_batch = copy
            assert handler.transfer_async(1, *specs(worker, [1], [1]))
        standin.device().drain()
        event = handler._transfers[1].end_event
        event.query = types.MethodType(lambda self: self.missing, event)  # AttributeError
        with pytest.raises(AttributeError):
            handler.get_finished()  # dropped the failed transfer, then raised
        gc.collect()
        assert len(pool.outstanding()) == 1  # the second, still queued
        assert pool.stats().parked == 0
        del event.query
        assert [(r.job_id, r.success) for r in handler.get_finished()] == [(1, True)]
        worker.shutdown()
    assert _leaks(record) == []
    assert pool.stats().leaks == 0
    assert pool.outstanding() == []


def test_a_failed_poll_parks_its_triple_on_the_end_event(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34 drops the triple of a transfer whose end event raised when polled, with its
    copy perhaps still queued: the triple comes back parked on that event, and no
    LeakWarning names vLLM's line.  The copy runs with its own descriptors."""
    _failing(gpu_worker, monkeypatch)
    bucketpool_vllm.install(kv_offload=True)
    pool = pool_of(gpu_worker)
    worker = make_worker(gpu_worker)
    handler = worker._store_handler
    gpu, host = (pages(each[0], PAGES[0]) for each in (device_pages(worker), host_pages(worker)))
    gpu[0] = np.arange(PAGES[0], dtype=np.uint8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.inference_mode():
            assert handler.transfer_async(0, *specs(worker, [0], [0]))  # queued, not run
        parked = handler._transfers[0].batch_src.data_ptr()
        event = handler._transfers[0].end_event
        event.query = _device_lost
        assert [(r.job_id, r.success) for r in handler.get_finished()] == [(0, False)]
        assert not handler._transfers
        gc.collect()
        del event.query  # the device answers again: the copy is still queued
        assert pool.stats().parked == 1
        assert pool.outstanding() == []  # released, parked
        other = gpu_worker._new_descriptor_buffers(1)
        assert other[0].data_ptr() != parked  # not reusable while the copy may read it
        other[0].fill_(-1)  # (had it been the parked buffer: the copy's source gone wrong)
        standin.device().drain()  # the copy runs, reading its own descriptors
        np.testing.assert_array_equal(host[0], gpu[0])
        assert pool.collect() == 1  # retired once its end event is done
        returns = _kv_offload._Returns()
        returns.append(other)
        worker.shutdown()
    assert _leaks(record) == []
    assert pool.stats().leaks == 0
    assert pool.stats().parked == 0
    assert pool.outstanding() == []


def test_shutdown_keeps_vllms_outcome_over_a_bad_triple(gpu_worker: types.ModuleType) -> None:
    bucketpool_vllm.install(kv_offload=True)
    handler = make_worker(gpu_worker)._store_handler
    first, second = (gpu_worker._new_descriptor_buffers(4) for _ in range(2))
    handler._buffer_pool = [(first[0], second[1], first[2])]  # a plain list, as vLLM's tests
    handler.shutdown()  # the mixed triple is not given back, and raises nothing
    assert not handler._buffer_pool
    returns = _kv_offload._Returns()
    returns.append(first)
    returns.append(second)
    assert pool_of(gpu_worker).outstanding() == []


def test_appends_are_checked(gpu_worker: types.ModuleType) -> None:
    bucketpool_vllm.install(kv_offload=True)
    returns = _kv_offload._Returns()
    first, second = (gpu_worker._new_descriptor_buffers(4) for _ in range(2))
    with pytest.raises(ReleaseError, match="not one triple"):
        returns.append((first[0], second[1], first[2]))
    returns.append(first)
    with pytest.raises(ReleaseError, match="already released"):
        returns.append(first)
    returns.append(second)
    assert not returns
    assert pool_of(gpu_worker).outstanding() == []


@pytest.mark.parametrize(
    "duplicate",
    [copy.deepcopy, lambda triple: pickle.loads(pickle.dumps(triple))],
    ids=["deepcopy", "pickle"],
)
@pytest.mark.parametrize("level", ["off", "strict"])
def test_descriptor_tensors_copy_as_vllms_own(
    gpu_worker: types.ModuleType, duplicate: object, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deep copy or pickle of the factory's triple works as with vLLM's factory.

    The factory is a drop-in for vLLM's ``_new_descriptor_buffers``, whose tensors deep copy
    and pickle: a copy is new memory and holds no hand-out (not a TypeError about a
    BufferHandle the caller never saw).
    """
    assert callable(duplicate)
    try:
        duplicate(gpu_worker._new_descriptor_buffers(4))  # vLLM's own factory's triple
    except Exception as error:  # (torch pickles no uint64 tensor)
        expected: type[Exception] | None = type(error)
    else:
        expected = None
    monkeypatch.setenv("BUCKETPOOL_DEBUG", level)  # strict: guarded views pickle as plain
    bucketpool_vllm.install(kv_offload=True)
    triple = gpu_worker._new_descriptor_buffers(4)
    returns = _kv_offload._Returns()
    try:
        for tensor in triple:
            tensor.fill_(7)
        if expected is not None:
            with pytest.raises(expected):
                duplicate(triple)
            return
        copied = duplicate(triple)
        assert [c.tolist() for c in copied] == [t.tolist() for t in triple]
        assert all(c.data_ptr() != t.data_ptr() for c, t in zip(copied, triple, strict=True))
        returns.append(tuple(copied))  # no holder: kept, as vLLM's list keeps its own
        assert len(returns) == 1
    finally:
        returns.append(triple)  # the one holder gives the buffer back
    assert pool_of(gpu_worker).outstanding() == []


def test_vllms_own_lists_keep_working(gpu_worker: types.ModuleType) -> None:
    """A handler made before install keeps its own triple, and a triple made after uninstall."""
    early = make_worker(gpu_worker)
    with torch.inference_mode():
        assert early.submit_store(0, *specs(early, [0], [0]))
    standin.device().drain()
    assert [r.job_id for r in early.get_finished()] == [0]
    own = early._store_handler._buffer_pool[0]  # vLLM's, in vLLM's plain list
    bucketpool_vllm.install(kv_offload=True)
    pool = pool_of(gpu_worker)
    late = make_worker(gpu_worker)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        with torch.inference_mode():
            for job, worker in enumerate((early, late), 1):
                assert worker.submit_store(job, *specs(worker, [job], [job]))
        standin.device().drain()
        assert [r.job_id for r in (*early.get_finished(), *late.get_finished())] == [1, 2]
        assert [t[0] is own[0] for t in early._store_handler._buffer_pool] == [True]  # reused
        assert not late._store_handler._buffer_pool  # released
        early.shutdown()
        bucketpool_vllm.uninstall()
        with torch.inference_mode():
            assert late.submit_store(3, *specs(late, [3], [3]))  # vLLM's own buffers again
        standin.device().drain()
        late.get_finished()
        assert len(late._store_handler._buffer_pool) == 1  # kept, as vLLM's list would
        late.shutdown()
        gc.collect()
    assert pool.outstanding() == []
    assert pool.stats().leaks == 0


def test_a_handler_made_before_install_reports_no_leak_when_it_grows(
    gpu_worker: types.ModuleType,
) -> None:
    """vLLM throws away a too-small triple from its own list: that is not a leak.

    docs/compat.md: a handler made before install "works as before"; no buffer is thrown
    away for being small, and a LeakWarning here would name vLLM's line for vLLM's design.
    """
    early = make_worker(gpu_worker)  # its _buffer_pool stays vLLM's plain list
    bucketpool_vllm.install(kv_offload=True)
    device = standin.device()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.inference_mode():
            assert early.submit_store(0, *specs(early, [0], [0]))  # 2 ops: a bucket of 16
            device.drain()
            assert [result.job_id for result in early.get_finished()] == [0]
            blocks = list(range(12))  # 24 ops: vLLM drops the 16 it pops, asks for 24
            assert early.submit_store(1, *specs(early, blocks, blocks))
            device.drain()
            assert [result.job_id for result in early.get_finished()] == [1]
        early.shutdown()
        gc.collect()
    assert _leaks(record) == []
    assert pool_of(gpu_worker).stats().leaks == 0


def _handler_class(module_name: str) -> type:
    """A handler class defined in *module_name*, with the four methods install looks for."""

    def __init__(self: Any) -> None:
        self._buffer_pool = []
        self._transfers = []

    def shutdown(self: Any) -> None:
        self._transfers.clear()

    methods = {name: lambda self, *a: None for name in _kv_offload._HANDLER}
    methods.update(__init__=__init__, shutdown=shutdown)
    return type("SingleDirectionNPUOffloadingHandler", (), {**methods, "__module__": module_name})


def test_install_rebinds_and_wraps_in_vllm_ascend(gpu_worker: types.ModuleType) -> None:
    """vllm-ascend's worker imports vLLM's factory or defines its own; both are served."""
    imported = types.ModuleType("vllm_ascend.kv_offload.imported")
    vars(imported)["_new_descriptor_buffers"] = gpu_worker._new_descriptor_buffers
    own = types.ModuleType("vllm_ascend.kv_offload.own")

    def own_factory(n: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.empty(n, dtype=torch.int64) for _ in range(3))

    handler = _handler_class(own.__name__)
    vars(own).update(_new_descriptor_buffers=own_factory, Handler=handler)
    originals = [vars(handler)[name] for name in WRAPPED]
    sys.modules[imported.__name__] = imported
    bucketpool_vllm.install(kv_offload=True)
    assert isinstance(imported._new_descriptor_buffers, functools.partial)
    sys.modules[own.__name__] = own  # not imported at install: install again serves it
    assert own._new_descriptor_buffers is own_factory
    unserved = handler()
    unserved.transfer_async()
    assert type(unserved._buffer_pool) is list
    bucketpool_vllm.install(kv_offload=True)
    assert isinstance(own._new_descriptor_buffers, functools.partial)
    made = handler()
    made.transfer_async()
    assert isinstance(made._buffer_pool, _kv_offload._Returns)
    made._transfers = [types.SimpleNamespace(end_event=None)]  # a Transfer with no triple
    made.shutdown()
    dtype = pool_of(gpu_worker).settings.dtype
    assert (pool_of(own) is pool_of(gpu_worker)) is (dtype == torch.int64)
    bucketpool_vllm.uninstall()
    assert imported._new_descriptor_buffers is gpu_worker._new_descriptor_buffers
    assert own._new_descriptor_buffers is own_factory
    assert [vars(handler)[name] for name in WRAPPED] == originals


def test_uninstall_restores_vllm(gpu_worker: types.ModuleType) -> None:
    cls = gpu_worker.SingleDirectionOffloadingHandler
    methods = [vars(cls)[name] for name in WRAPPED]
    factory = gpu_worker._new_descriptor_buffers
    bucketpool_vllm.install()  # without kv_offload: the KV worker is untouched
    assert gpu_worker._new_descriptor_buffers is factory
    assert [vars(cls)[name] for name in WRAPPED] == methods
    bucketpool_vllm.install(kv_offload=True)
    bucketpool_vllm.install(kv_offload=True)  # again: nothing more
    assert len(_kv_offload._swaps) == 1 + len(WRAPPED)
    assert not {id(vars(cls)[name]) for name in WRAPPED} & {id(each) for each in methods}
    bucketpool_vllm.uninstall()
    assert gpu_worker._new_descriptor_buffers is factory
    assert [vars(cls)[name] for name in WRAPPED] == methods
    assert not bucketpool_vllm.installed()
    assert not _kv_offload._pools


def test_uninstall_keeps_a_parked_buffer_until_its_copy_is_done(
    gpu_worker: types.ModuleType, orphans: collections.deque[Any]
) -> None:
    bucketpool_vllm.install(kv_offload=True)
    triple = gpu_worker._new_descriptor_buffers(16)
    handle = _kv_offload._holder(triple)
    assert handle is not None
    memory = weakref.ref(handle._buffer.base)  # the buffer's own tensor
    running = FlagEvent()  # the copy that reads the descriptors
    handle.record_event(running)
    handle.release()
    del triple, handle
    bucketpool_vllm.uninstall()  # the per-process pools go
    assert not _kv_offload._pools
    assert memory() is not None  # was freed under the copy
    assert orphaned_buffers() == 1
    running.done = True
    for _ in range(100):  # later pool calls ask it
        BucketPool().collect()
    assert memory() is None
    assert orphaned_buffers() == 0


def test_uninstall_restores_a_factory_bound_after_install(gpu_worker: types.ModuleType) -> None:
    """A module imported after install binds bucketpool's factory: uninstall undoes it.

    docs/compat.md: modules imported after `install` are served by calling it again, and
    "`uninstall()` puts back the factory and the methods".
    """
    original = gpu_worker._new_descriptor_buffers
    bucketpool_vllm.install(kv_offload=True)
    late = types.ModuleType("vllm_ascend.kv_offload.late")  # `from ...gpu_worker import` it
    vars(late)["_new_descriptor_buffers"] = gpu_worker._new_descriptor_buffers
    sys.modules[late.__name__] = late
    try:
        bucketpool_vllm.install(kv_offload=True)  # again, for the module imported since
        bucketpool_vllm.uninstall()
        assert late._new_descriptor_buffers is original
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            bucketpool_vllm.install(kv_offload=True)  # would probe a stale partial: a leak
            gc.collect()
        assert _leaks(record) == []
    finally:
        sys.modules.pop(late.__name__, None)


def test_unservable_factory_replaces_nothing(gpu_worker: types.ModuleType) -> None:
    odd = types.ModuleType("vllm.odd")
    vars(odd)["_new_descriptor_buffers"] = lambda n: (torch.empty(n),) * 3
    sys.modules[odd.__name__] = odd
    original = gpu_worker._new_descriptor_buffers
    with pytest.raises(
        RuntimeError,
        match=r"vllm\.odd\._new_descriptor_buffers\(1\).*float32.*nothing was replaced",
    ):
        bucketpool_vllm.install(kv_offload=True)
    assert gpu_worker._new_descriptor_buffers is original
    assert not _kv_offload._swaps
    assert not bucketpool_vllm.installed()  # nor the EC part


def test_pinning_where_torch_cannot_pin_installs_nothing(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's platform says it can pin (``PIN_MEMORY``), torch cannot: the EC part stays vLLM's."""
    try:
        torch.empty(0, pin_memory=True)
    except RuntimeError:
        pass
    else:
        pytest.skip("torch can pin here: vLLM's pinned descriptors are served")
    monkeypatch.setattr(gpu_worker, "PIN_MEMORY", True)
    ec = importlib.import_module(f"{standin.WORKER}.descriptor_buffers")
    originals = (ec.DescriptorBufferPool, ec.DescriptorBuffers, gpu_worker._new_descriptor_buffers)

    with pytest.raises(RuntimeError, match="pins memory, which needs an accelerator"):
        bucketpool_vllm.install(kv_offload=True)

    assert (ec.DescriptorBufferPool, ec.DescriptorBuffers) == originals[:2]
    assert gpu_worker._new_descriptor_buffers is originals[2]
    assert not bucketpool_vllm.installed()
    assert not _kv_offload._swaps


def test_no_kv_worker_is_an_import_error(
    gpu_worker: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, standin.KV_WORKER, None)
    with pytest.raises(ImportError, match=r"vllm\.v1\.kv_offload\.cpu\.gpu_worker"):
        bucketpool_vllm.install(kv_offload=True)
