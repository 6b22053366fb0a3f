"""Tests of bucketpool.vllm against stand-in vLLM module trees (vLLM cannot be installed here).

Each tree is built from `types.ModuleType` objects under the real dotted names and put in
`sys.modules` through `monkeypatch`, so that every test leaves `sys.modules` as it found it.
The stand-in classes behave like vLLM's: a LIFO pool of NamedTuples of three or six fields.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import types
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import numpy as np
import numpy.typing as npt
import pytest
import torch
from _events import DeviceError, SyncEvent

import bucketpool
from bucketpool import compat
from bucketpool import vllm as bucketpool_vllm

LEGACY = "vllm.distributed.ec_transfer.ec_connector.cpu"
CANONICAL = "vllm.backends.distributed.ec_transfer.ec_connector.cpu"


class TensorBuffers(NamedTuple):
    """vLLM's first shape."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor


class AliasedBuffers(NamedTuple):
    """vLLM's later shape: the tensors plus numpy aliases, filled through add_copies."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor
    src_np: npt.NDArray[Any]
    dst_np: npt.NDArray[Any]
    sizes_np: npt.NDArray[Any]

    def add_copies(
        self,
        first: int,
        sources: npt.NDArray[Any],
        destinations: npt.NDArray[Any],
        byte_counts: npt.NDArray[Any],
    ) -> None:
        end = first + len(sources)
        self.src_np[first:end] = sources
        self.dst_np[first:end] = destinations
        self.sizes_np[first:end] = byte_counts


class StreamBuffers(NamedTuple):
    """A shape bucketpool does not know: a made-up future field."""

    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor
    stream: torch.Tensor


def make_pool_class(
    buffers: Callable[..., tuple[Any, ...]], dtypes: tuple[torch.dtype, torch.dtype, torch.dtype]
) -> type:
    """A stand-in for vLLM's DescriptorBufferPool handing out *buffers* of *dtypes*."""

    class DescriptorBufferPool:
        def __init__(self) -> None:
            self._pool: list[tuple[Any, ...]] = []

        def acquire(self, n: int) -> tuple[Any, ...]:
            if self._pool:
                bufs = self._pool.pop()
                if bufs[0].numel() >= n:
                    return bufs
            src, dst, sizes = (torch.empty(n, dtype=dtype) for dtype in dtypes)
            if buffers is AliasedBuffers:
                return buffers(src, dst, sizes, src.numpy(), dst.numpy(), sizes.numpy())
            if buffers is StreamBuffers:
                return buffers(src, dst, sizes, torch.empty(0))
            return buffers(src, dst, sizes)

        def release(self, bufs: tuple[Any, ...]) -> None:
            self._pool.append(bufs)

    return DescriptorBufferPool


@attrs.frozen
class Tree:
    """One stand-in vLLM: its descriptor-buffers module, the worker, and the originals."""

    module: types.ModuleType
    worker: types.ModuleType
    pool: type
    buffers: type


class Builder:
    """Builds stand-in vLLM trees under the real names, registered through monkeypatch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def package(self, name: str) -> types.ModuleType:
        """Register the package *name* and its parents (each one only once)."""
        existing = sys.modules.get(name)
        if isinstance(existing, types.ModuleType):
            return existing
        module = types.ModuleType(name)
        module.__path__ = []  # a package, in which nothing else can be found
        self.register(module)
        return module

    def register(self, module: types.ModuleType) -> None:
        """Register *module* under its name, creating its parent packages."""
        self.alias(module.__name__, module)

    def alias(self, name: str, module: types.ModuleType) -> None:
        """Register *module* under *name* too, as vLLM's compatibility shims do."""
        parent_name, _, child = name.rpartition(".")
        if parent_name:
            parent = self.package(parent_name)
            setattr(parent, child, module)
        self._monkeypatch.setitem(sys.modules, name, module)

    def vllm(self, version: str = "0.33.0") -> types.ModuleType:  # one bucketpool was tested with
        root = self.package("vllm")
        root.__version__ = version  # type: ignore[attr-defined]
        return root

    def tree(
        self,
        buffers: Callable[..., tuple[Any, ...]] = TensorBuffers,
        dtypes: tuple[torch.dtype, torch.dtype, torch.dtype] = (torch.int64,) * 3,
        *,
        prefix: str = LEGACY,
    ) -> Tree:
        """A vLLM whose worker did ``from .descriptor_buffers import ...`` (at *prefix*)."""
        self.vllm()
        module = types.ModuleType(f"{prefix}.worker.descriptor_buffers")
        module.DescriptorBuffers = buffers  # type: ignore[attr-defined]
        module.DescriptorBufferPool = make_pool_class(buffers, dtypes)  # type: ignore[attr-defined]
        worker = self.package(f"{prefix}.worker")
        self.register(module)
        worker.DescriptorBufferPool = module.DescriptorBufferPool  # type: ignore[attr-defined]
        worker.DescriptorBuffers = module.DescriptorBuffers  # type: ignore[attr-defined]
        return Tree(module, worker, module.DescriptorBufferPool, module.DescriptorBuffers)


@pytest.fixture(autouse=True)
def _no_vllm_left_behind() -> Iterator[None]:
    """Every test leaves sys.modules as it found it (this teardown runs after monkeypatch's)."""
    before = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    yield
    after = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    assert after == before


@pytest.fixture(autouse=True)
def _uninstalled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start and end uninstalled, while the stand-in trees are still registered."""
    assert not bucketpool_vllm.installed()
    yield
    bucketpool_vllm.uninstall()


@pytest.fixture
def build(monkeypatch: pytest.MonkeyPatch) -> Builder:
    # Whatever the environment holds, these tests see only their stand-ins.
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    return Builder(monkeypatch)


def assert_untouched(tree: Tree) -> None:
    assert tree.module.DescriptorBufferPool is tree.pool
    assert tree.module.DescriptorBuffers is tree.buffers
    assert tree.worker.DescriptorBufferPool is tree.pool
    assert tree.worker.DescriptorBuffers is tree.buffers


# -- install -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_three_fields_get_the_three_field_adapter(build: Builder, dtype: torch.dtype) -> None:
    tree = build.tree(TensorBuffers, (dtype,) * 3)

    bucketpool_vllm.install()

    assert bucketpool_vllm.installed()
    for module in (tree.module, tree.worker):
        assert module.DescriptorBuffers is compat.DescriptorBuffers
        assert module.DescriptorBufferPool is tree.module.DescriptorBufferPool
    pool = tree.worker.DescriptorBufferPool()  # as vLLM calls it: no arguments
    assert isinstance(pool, tree.worker.DescriptorBufferPool)
    bufs = pool.acquire(5)
    assert isinstance(bufs, compat.DescriptorBuffers)  # a private subclass, see compat
    assert [t.dtype for t in bufs] == [dtype] * 3
    assert [t.numel() for t in bufs] == [pool.pool.bucket_capacity(5)] * 3  # capacity >= n
    pool.release(bufs)
    again = pool.acquire(5)
    assert again is not bufs  # a new tuple per hand-out: a stale release is refused
    assert [t.data_ptr() for t in again] == [t.data_ptr() for t in bufs]  # the same memory
    pool.release(again)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_six_fields_get_the_aliased_adapter(build: Builder, dtype: torch.dtype) -> None:
    tree = build.tree(AliasedBuffers, (dtype,) * 3)

    bucketpool_vllm.install()

    for module in (tree.module, tree.worker):
        assert module.DescriptorBuffers is compat.AliasedDescriptorBuffers
        assert module.DescriptorBufferPool is tree.module.DescriptorBufferPool
    pool = tree.worker.DescriptorBufferPool()
    assert isinstance(pool, tree.worker.DescriptorBufferPool)
    bufs = pool.acquire(4)
    assert isinstance(bufs, compat.AliasedDescriptorBuffers)
    assert [t.dtype for t in bufs[:3]] == [dtype] * 3
    assert [a.dtype for a in bufs[3:]] == [np.dtype(str(dtype).removeprefix("torch."))] * 3
    # As vLLM's worker fills them: uint64 numpy addresses, some with the top bit set.
    high = np.uint64(1 << 63)
    bufs.add_copies(1, high + np.arange(2, dtype=np.uint64), np.array([16, 32]), np.array([8, 8]))
    assert bufs.src_np.view(np.uint64)[1:3].tolist() == [1 << 63, (1 << 63) + 1]
    assert bufs.dst_ptrs[1:3].tolist() == [16, 32]
    assert bufs.sizes[1:3].tolist() == [8, 8]
    pool.release(bufs)


@pytest.mark.parametrize("buffers", [TensorBuffers, AliasedBuffers], ids=["three", "six"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_vllms_pool_stays_a_class_to_check_and_subclass(
    build: Builder, buffers: Callable[..., tuple[Any, ...]], dtype: torch.dtype
) -> None:
    # Issue: install() put a functools.partial in its place: isinstance raised TypeError
    # and a subclass (vllm-ascend subclasses vLLM's classes) a metaclass conflict.
    tree = build.tree(buffers, (dtype,) * 3)
    bucketpool_vllm.install()
    installed = tree.worker.DescriptorBufferPool
    plugin = types.ModuleType("vllm_ascend.stand_in_pool")
    build.register(plugin)

    class AscendPool(installed):  # type: ignore[misc, valid-type]  # as a plugin writes it
        def __init__(self) -> None:
            super().__init__()
            self.acquired: list[int] = []

        def acquire(self, n: int) -> Any:
            self.acquired.append(n)
            return super().acquire(n)

    plugin.AscendPool = AscendPool  # type: ignore[attr-defined]
    pool = AscendPool()
    bufs = pool.acquire(3)

    assert isinstance(pool, installed)
    assert isinstance(installed(), installed)
    assert not isinstance(tree.pool(), installed)
    assert pool.acquired == [3]
    assert [t.dtype for t in bufs[:3]] == [dtype] * 3  # vLLM's, through super().__init__()
    assert isinstance(bufs, tree.worker.DescriptorBuffers)  # bucketpool's, rebound there
    pool.release(bufs)
    assert pool.pool.stats().active_requests.current == 0
    bucketpool_vllm.uninstall()
    assert_untouched(tree)
    assert plugin.AscendPool is AscendPool  # a plugin's own class is no binding of install's


def test_install_twice_is_harmless(build: Builder) -> None:
    tree = build.tree(AliasedBuffers, (torch.uint64,) * 3)
    bucketpool_vllm.install()
    replacement = tree.module.DescriptorBufferPool

    bucketpool_vllm.install()

    assert tree.module.DescriptorBufferPool is replacement
    assert tree.worker.DescriptorBufferPool is replacement
    pool = tree.worker.DescriptorBufferPool()
    bufs = pool.acquire(1)
    assert bufs.src_ptrs.dtype == torch.uint64
    pool.release(bufs)
    bucketpool_vllm.uninstall()
    assert_untouched(tree)


def test_install_rebinds_every_vllm_binding_of_the_originals(build: Builder) -> None:
    tree = build.tree()
    other = types.ModuleType("vllm.other")
    other.Pool = tree.pool  # type: ignore[attr-defined]  # bound under another name
    other.unrelated = StreamBuffers  # type: ignore[attr-defined]  # not this vLLM's class
    build.register(other)
    outside = types.ModuleType("vllm_plugin_stand_in")  # not a vllm.* module
    outside.DescriptorBufferPool = tree.pool  # type: ignore[attr-defined]
    build.register(outside)

    bucketpool_vllm.install()

    assert other.Pool is tree.module.DescriptorBufferPool
    assert other.unrelated is StreamBuffers
    assert outside.DescriptorBufferPool is tree.pool


def test_install_rebinds_and_uninstall_restores_in_vllm_ascend_modules(build: Builder) -> None:
    tree = build.tree(AliasedBuffers)
    ascend = types.ModuleType("vllm_ascend.distributed.ec_transfer.ec_connector.cpu_worker")
    ascend.DescriptorBufferPool = tree.pool  # type: ignore[attr-defined]  # its own import
    ascend.DescriptorBuffers = tree.buffers  # type: ignore[attr-defined]
    build.register(ascend)

    bucketpool_vllm.install()

    assert ascend.DescriptorBufferPool is tree.module.DescriptorBufferPool  # bucketpool's
    assert ascend.DescriptorBuffers is compat.AliasedDescriptorBuffers
    bucketpool_vllm.uninstall()
    assert ascend.DescriptorBufferPool is tree.pool
    assert ascend.DescriptorBuffers is tree.buffers


class Transfer(NamedTuple):
    end_event: SyncEvent
    bufs: Any


def add_worker(tree: Tree) -> Any:
    """An ``ECCPUWorker`` in *tree*'s worker package, whose shutdown is vLLM's in shape."""
    module = tree.worker

    class ECCPUWorker:
        def __init__(self) -> None:
            self._buf_pool = module.DescriptorBufferPool()  # the worker module's global
            self._save_bufs: Any = None
            self._inflight_saves: list[Transfer] = []
            self._inflight_loads: list[Transfer] = []

        def shutdown(self) -> None:
            for transfer in (*self._inflight_saves, *self._inflight_loads):
                transfer.end_event.synchronize()
            self._save_bufs = None  # dropped, not released: vLLM's pool does not mind
            self._inflight_saves.clear()
            self._inflight_loads.clear()

    module.ECCPUWorker = ECCPUWorker  # type: ignore[attr-defined]
    return ECCPUWorker


def test_shutdown_gives_back_what_vllms_shutdown_drops(build: Builder) -> None:
    worker_class = add_worker(build.tree(AliasedBuffers))
    original = worker_class.shutdown
    made_before = worker_class()
    bucketpool_vllm.install()
    worker = worker_class()
    events = [SyncEvent(), SyncEvent()]
    worker._save_bufs = worker._buf_pool.acquire(3)  # an open save batch
    worker._inflight_saves.append(Transfer(events[0], worker._buf_pool.acquire(40)))
    worker._inflight_loads.append(Transfer(events[1], worker._buf_pool.acquire(3)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.shutdown()
        made_before.shutdown()  # vLLM's own pool: vLLM's shutdown alone

    assert [str(warning.message) for warning in caught] == []  # no LeakWarning
    assert all(event.done for event in events)  # vLLM's shutdown ran (and synchronised)
    stats = worker._buf_pool.pool.stats()
    assert (stats.leaks, stats.active_requests.current, stats.parked_bytes) == (0, 0, 0)
    assert len(worker._buf_pool._pool) == 3
    bucketpool_vllm.uninstall()
    assert worker_class.shutdown is original


class _LostDevice(SyncEvent):
    """A copy on a device that was lost: never done, and waiting for it fails."""

    def synchronize(self) -> None:
        raise DeviceError("device lost")


def test_shutdown_gives_back_what_it_holds_when_vllms_shutdown_raises(build: Builder) -> None:
    worker_class = add_worker(build.tree(AliasedBuffers))
    bucketpool_vllm.install()
    worker = worker_class()
    lost = _LostDevice()
    worker._save_bufs = worker._buf_pool.acquire(3)  # an open save batch: no copy
    worker._inflight_saves.append(Transfer(lost, worker._buf_pool.acquire(40)))
    pool = worker._buf_pool.pool

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DeviceError):  # vLLM's shutdown raises: its error goes on
            worker.shutdown()

    assert [str(warning.message) for warning in caught] == []  # no LeakWarning
    stats = pool.stats()
    assert (stats.active_requests.current, stats.leaks) == (0, 0)  # both given back
    assert stats.parked == 1  # the flight's: its copy may still read it
    assert lost.queries >= 1  # parked on its end event
    lost.done = True
    assert pool.collect() == 1


def test_shutdown_still_reports_a_real_leak(build: Builder) -> None:
    worker_class = add_worker(build.tree(AliasedBuffers))
    bucketpool_vllm.install()
    worker = worker_class()
    for pool in (None, worker._buf_pool):  # workers as vLLM's and vllm-ascend's tests make them
        bare: Any = object.__new__(worker_class)  # (without `_save_bufs`; vLLM's: no pool)
        bare._buf_pool = pool
        bare._inflight_saves, bare._inflight_loads = [], []
        bare.shutdown()
    worker._save_bufs = worker._buf_pool.acquire(3)

    with pytest.warns(bucketpool.LeakWarning, match="never released"):
        worker._save_bufs = None  # dropped by the worker, before shutdown
    worker.shutdown()

    assert worker._buf_pool.pool.stats().leaks == 1


def test_install_finds_the_canonical_module_behind_the_legacy_aliases(build: Builder) -> None:
    tree = build.tree(AliasedBuffers, prefix=CANONICAL)
    # Newer vLLM: the old module path is the same module object, and the old worker package
    # is a shim that forwards attribute lookups to the canonical worker.
    build.package(f"{LEGACY}.worker")
    build.alias(f"{LEGACY}.worker.descriptor_buffers", tree.module)
    legacy_worker = sys.modules[f"{LEGACY}.worker"]
    legacy_worker.__getattr__ = lambda name: getattr(tree.worker, name)  # type: ignore[method-assign]

    bucketpool_vllm.install()

    assert tree.worker.DescriptorBuffers is compat.AliasedDescriptorBuffers
    assert legacy_worker.DescriptorBufferPool is tree.module.DescriptorBufferPool
    assert "DescriptorBufferPool" not in vars(legacy_worker)
    bucketpool_vllm.uninstall()
    assert_untouched(tree)
    assert legacy_worker.DescriptorBufferPool is tree.pool


def test_a_reload_keeps_the_install_true_and_undoable(build: Builder) -> None:
    # hostile review 3, case 12: a reload used to forget the install, so that installed()
    # said False, install() did nothing and uninstall() could not put vLLM's classes back.
    tree = build.tree()
    bucketpool_vllm.install()
    replacement = tree.module.DescriptorBufferPool

    importlib.reload(bucketpool_vllm)

    assert bucketpool_vllm.installed()
    bucketpool_vllm.install()  # does nothing: it does not wrap its own adapters
    assert tree.module.DescriptorBufferPool is replacement
    bucketpool_vllm.uninstall()
    assert not bucketpool_vllm.installed()
    assert_untouched(tree)


def test_a_fresh_import_finds_the_install_on_vllms_module(
    build: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = build.tree()
    bucketpool_vllm.install()
    monkeypatch.delitem(sys.modules, "bucketpool.vllm")

    fresh = importlib.import_module("bucketpool.vllm")

    assert fresh is not bucketpool_vllm
    assert fresh.installed()
    fresh.uninstall()
    assert not fresh.installed()
    assert not bucketpool_vllm.installed()
    assert_untouched(tree)


def test_a_reload_of_vllms_module_ends_the_install(build: Builder) -> None:
    # Reloading vLLM's module runs it again in the same namespace: new classes of its own
    # are bound there (the record of the install survives), so the install is over; the
    # worker, not reloaded, still binds bucketpool's.
    tree = build.tree()
    bucketpool_vllm.install()
    reloaded = make_pool_class(TensorBuffers, (torch.int64,) * 3)
    tree.module.DescriptorBufferPool = reloaded  # type: ignore[attr-defined]

    assert not bucketpool_vllm.installed()
    bucketpool_vllm.install()  # undoes the stale one, then installs over the new classes
    assert bucketpool_vllm.installed()
    assert tree.module.DescriptorBufferPool is not reloaded
    assert tree.worker.DescriptorBufferPool is tree.module.DescriptorBufferPool
    bucketpool_vllm.uninstall()
    assert tree.module.DescriptorBufferPool is reloaded
    assert tree.worker.DescriptorBufferPool is tree.pool  # what it bound before any install
    assert tree.module.DescriptorBuffers is tree.buffers


def test_vllms_module_imported_anew_ends_the_install(build: Builder) -> None:
    tree = build.tree()
    bucketpool_vllm.install()
    fresh = types.ModuleType(tree.module.__name__)  # as del sys.modules[...]; import ...
    fresh.DescriptorBufferPool = make_pool_class(TensorBuffers, (torch.int64,) * 3)  # type: ignore[attr-defined]
    fresh.DescriptorBuffers = TensorBuffers  # type: ignore[attr-defined]
    build.register(fresh)

    assert not bucketpool_vllm.installed()
    bucketpool_vllm.install()
    assert bucketpool_vllm.installed()
    pool = fresh.DescriptorBufferPool()
    bufs = pool.acquire(1)
    assert bufs.src_ptrs.dtype == torch.int64
    pool.release(bufs)
    assert type(pool).__module__ == "bucketpool.vllm"
    bucketpool_vllm.uninstall()
    assert not bucketpool_vllm.installed()
    assert_untouched(tree)  # the old module and the worker got vLLM's classes back too


def test_pools_made_before_install_stay_vllms(build: Builder) -> None:
    tree = build.tree()
    before = tree.worker.DescriptorBufferPool()
    bufs = before.acquire(3)

    bucketpool_vllm.install()

    before.release(bufs)
    assert before.acquire(3) is bufs
    assert type(before) is tree.pool


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0", "0.33.0+cu129"])
def test_a_tested_vllm_is_installed_and_says_so(build: Builder, version: str) -> None:
    build.tree(AliasedBuffers)
    build.vllm(version)

    result = bucketpool_vllm.install()

    assert result == bucketpool_vllm.InstallResult(
        installed=True, vllm_version=version, tested=True
    )
    assert bucketpool_vllm.installed()


def untested_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "vllm.bucketpool" and record.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("version", ["0.35.0", "0.33.1", "0.34.0rc1", "dev", None])
@pytest.mark.parametrize("kv_offload", [False, True])
def test_an_untested_vllm_gets_nothing_and_one_warning(
    build: Builder, caplog: pytest.LogCaptureFixture, version: str | None, kv_offload: bool
) -> None:
    tree = build.tree(AliasedBuffers)
    if version is None:
        del sys.modules["vllm"].__version__  # (monkeypatch restores the whole module)
    else:
        build.vllm(version)
    shown = version or "unknown"

    with caplog.at_level(logging.WARNING, logger="vllm.bucketpool"):
        result = bucketpool_vllm.install(kv_offload=kv_offload)

    assert result == bucketpool_vllm.InstallResult(
        installed=False, vllm_version=shown, tested=False
    )
    assert_untouched(tree)
    assert not bucketpool_vllm.installed()
    assert untested_warnings(caplog) == [
        "bucketpool.vllm.install() installed nothing: bucketpool is tested with vLLM 0.33.0 "
        f"and 0.34.0, not {shown}. install(untested=True), or BUCKETPOOL_VLLM_UNTESTED=1 for "
        "the plugin, installs it all the same"
    ]


def test_untested_true_installs_on_an_untested_vllm(
    build: Builder, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build.tree(AliasedBuffers)
    build.vllm("0.35.0")

    with caplog.at_level(logging.WARNING, logger="vllm.bucketpool"):
        result = bucketpool_vllm.install(untested=True)

    assert result == bucketpool_vllm.InstallResult(
        installed=True, vllm_version="0.35.0", tested=False
    )
    assert tree.module.DescriptorBuffers is compat.AliasedDescriptorBuffers
    assert bucketpool_vllm.installed()
    assert untested_warnings(caplog) == []


# -- uninstall -----------------------------------------------------------------------------


def test_uninstall_restores_the_originals(build: Builder) -> None:
    tree = build.tree(AliasedBuffers)
    bucketpool_vllm.install()
    late = types.ModuleType("vllm.imported_after_install")
    late.DescriptorBufferPool = tree.module.DescriptorBufferPool  # type: ignore[attr-defined]
    late.DescriptorBuffers = tree.module.DescriptorBuffers  # type: ignore[attr-defined]
    build.register(late)

    bucketpool_vllm.uninstall()

    assert not bucketpool_vllm.installed()
    assert_untouched(tree)
    assert late.DescriptorBufferPool is tree.pool
    assert late.DescriptorBuffers is tree.buffers
    # and it can be installed again
    bucketpool_vllm.install()
    assert tree.module.DescriptorBuffers is compat.AliasedDescriptorBuffers


def test_uninstall_without_install_is_harmless(build: Builder) -> None:
    tree = build.tree()

    bucketpool_vllm.uninstall()
    bucketpool_vllm.uninstall()

    assert_untouched(tree)


def test_uninstall_keeps_bindings_made_by_others(build: Builder) -> None:
    tree = build.tree()
    bucketpool_vllm.install()
    tree.worker.DescriptorBufferPool = compat.DescriptorBufferPool  # type: ignore[attr-defined]

    bucketpool_vllm.uninstall()

    assert tree.module.DescriptorBufferPool is tree.pool
    assert tree.worker.DescriptorBufferPool is compat.DescriptorBufferPool


# -- refusals ------------------------------------------------------------------------------


def test_unknown_fields_raise_and_change_nothing(build: Builder) -> None:
    tree = build.tree(StreamBuffers)

    with pytest.raises(RuntimeError, match="fields") as caught:
        bucketpool_vllm.install()

    message = str(caught.value)
    for field in StreamBuffers._fields:
        assert repr(field) in message
    assert "Nothing was replaced" in message
    assert_untouched(tree)
    assert not bucketpool_vllm.installed()


def test_mixed_dtypes_raise_and_change_nothing(build: Builder) -> None:
    tree = build.tree(AliasedBuffers, (torch.uint64, torch.uint64, torch.int64))

    with pytest.raises(RuntimeError, match=r"torch\.uint64, torch\.uint64, torch\.int64"):
        bucketpool_vllm.install()

    assert_untouched(tree)
    assert not bucketpool_vllm.installed()


def test_a_pool_that_cannot_be_asked_raises_and_changes_nothing(
    build: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = build.tree()

    def needs_an_argument(self: object, size: int) -> None:
        raise AssertionError("not called")

    monkeypatch.setattr(tree.pool, "__init__", needs_an_argument)

    with pytest.raises(RuntimeError, match="could not ask") as caught:
        bucketpool_vllm.install()

    assert isinstance(caught.value.__cause__, TypeError)
    assert_untouched(tree)


def torch_can_pin() -> bool:
    try:
        torch.empty(0, pin_memory=True)
    except RuntimeError:  # "pin_memory=True requires a CUDA or other accelerator backend"
        return False
    return True


@pytest.mark.parametrize("pinned", [False, True], ids=["float32", "pinned-int64"])
def test_a_kv_part_that_fails_installs_nothing(build: Builder, pinned: bool) -> None:
    # Issue: on a host that cannot pin, install(kv_offload=True) raised "nothing was
    # replaced" with the EC part installed: installed() True, vLLM's pool swapped.
    if pinned and torch_can_pin():
        pytest.skip("torch can pin here: vLLM's pinned descriptors are served")
    tree = build.tree(AliasedBuffers)
    worker = types.ModuleType("vllm.v1.kv_offload.cpu.gpu_worker")
    dtype = torch.int64 if pinned else torch.float32

    def _new_descriptor_buffers(n: int) -> tuple[torch.Tensor, ...]:  # vLLM's, with PIN_MEMORY
        return tuple(torch.empty(n, dtype=dtype, pin_memory=pinned) for _ in range(3))

    vars(worker)["_new_descriptor_buffers"] = _new_descriptor_buffers
    build.register(worker)

    with pytest.raises(RuntimeError, match="nothing was replaced") as caught:
        bucketpool_vllm.install(kv_offload=True)

    assert ("KV offload pins memory, which needs an accelerator" in str(caught.value)) is (
        not torch_can_pin()
    )
    assert_untouched(tree)
    assert worker._new_descriptor_buffers is _new_descriptor_buffers
    assert not bucketpool_vllm.installed()


def test_no_kv_worker_installs_nothing(build: Builder, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = build.tree(AliasedBuffers)
    monkeypatch.setitem(sys.modules, "vllm.v1.kv_offload.cpu.gpu_worker", None)

    with pytest.raises(ImportError, match=r"vllm\.v1\.kv_offload\.cpu\.gpu_worker"):
        bucketpool_vllm.install(kv_offload=True)

    assert_untouched(tree)
    assert not bucketpool_vllm.installed()


def test_without_vllm_install_says_vllm_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package looks like

    with pytest.raises(ImportError, match="needs vLLM") as caught:
        bucketpool_vllm.install()

    message = str(caught.value)  # how to install vLLM without losing this torch
    assert f"'pip install vllm' would replace torch {torch.__version__}" in message
    assert "pip install --no-deps vllm==VERSION (bucketpool is tested with 0.33.0 and 0.34.0)" in (
        message
    )
    assert "then vLLM's other requirements by hand" in message
    assert "-c " not in message  # a constraints file keeping torch makes pip fail
    assert not isinstance(caught.value, ModuleNotFoundError)
    assert not bucketpool_vllm.installed()


def stand_in_vllm_wheel(directory: Path) -> None:
    """A wheel of vLLM 0.33.0 that pins its torch, as the real one does (and nothing else)."""
    info = "vllm-0.33.0.dist-info"
    files = {
        "vllm/__init__.py": "__version__ = '0.33.0'\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n"
        "Requires-Dist: torch==2.14.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(directory / "vllm-0.33.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


def dry_run(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``pip install --dry-run`` from *directory* alone, with no configuration but ours."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    options = ["--dry-run", "--no-index", "--find-links", str(directory)]
    return subprocess.run(
        [sys.executable, "-m", "pip", *arguments, *options, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def test_the_advice_without_vllm_installs_vllm_and_keeps_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Issue: the advice pinned this torch in a constraints file, and pip then ended with
    # ResolutionImpossible, vLLM pinning another torch (0.33.0: torch==2.14.0).
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="needs vLLM") as caught:
        bucketpool_vllm.install()
    command = re.search(r"pip install --no-deps vllm==VERSION", str(caught.value))
    assert command is not None
    stand_in_vllm_wheel(tmp_path)
    (tmp_path / "c.txt").write_text(f"torch=={torch.__version__}\n")
    pinned = dry_run(tmp_path, "install", "-c", str(tmp_path / "c.txt"), "vllm==0.33.0")
    assert "ResolutionImpossible" in pinned.stderr, pinned  # the wheel pins torch, as vLLM's

    advised = dry_run(tmp_path, *command[0].replace("VERSION", "0.33.0").split()[1:])

    assert advised.returncode == 0, advised
    assert advised.stdout.splitlines()[-1] == "Would install vllm-0.33.0"  # torch untouched


def test_vllm_without_the_module_says_so(build: Builder) -> None:
    build.vllm("0.6.0")

    with pytest.raises(ImportError, match=r"vLLM 0\.6\.0 has no EC CPU") as caught:
        bucketpool_vllm.install(untested=True)

    assert f"{LEGACY}.worker.descriptor_buffers" in str(caught.value)


def test_a_broken_vllm_import_is_not_disguised(
    build: Builder, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    build.vllm()
    worker = build.package(f"{LEGACY}.worker")
    worker.__path__ = [str(tmp_path)]
    (tmp_path / "descriptor_buffers.py").write_text("import bucketpool_missing_dependency\n")
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))

    with pytest.raises(ModuleNotFoundError) as caught:
        bucketpool_vllm.install()

    assert caught.value.name == "bucketpool_missing_dependency"
    assert str(caught.value).startswith(
        "bucketpool.vllm.install(): vLLM imports 'bucketpool_missing_dependency', which is "
        "not installed (No module named 'bucketpool_missing_dependency'); install it"
    )
    assert not bucketpool_vllm.installed()


def test_a_vllm_that_cannot_import_a_dependency_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("import bucketpool_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ModuleNotFoundError, match="vLLM imports 'bucketpool_missing") as caught:
        bucketpool_vllm.install()  # it raised the bare error of vllm/__init__.py's import

    assert caught.value.name == "bucketpool_missing_dependency"
    advice = f"keeping torch {torch.__version__}: pip install -c c.txt PACKAGE"
    assert advice in str(caught.value)
