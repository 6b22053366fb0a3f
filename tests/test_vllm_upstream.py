"""``upstream/``'s patch: vLLM 0.34.0 with a descriptor-pool hook, served by bucketpool unbound.

The patch applies cleanly to a copy of vLLM 0.34.0's wheel (``.vllm/site``) and is refused
by another vLLM (0.33.0's modules, ``.vllm/0.33.0/site``).  On the patched copy, vLLM's own
EC CPU worker and KV-offload worker tests (those `test_vllm_tests` runs, through
`vllm_plugin`) have for every test the outcome they have on vLLM itself: with vLLM's default
pool, and with bucketpool's factory set by bucketpool's general plugin, which rebinds
nothing.  vLLM's default pool and bucketpool's both keep a buffer released with an end event
out of reuse until the event is done, retire it on ``collect()``, and let go of everything on
``shutdown()``; the patched HiSparse worker (whose tests vLLM's sdist lacks) spills through
either.  Skipped without vLLM 0.34.0, unless ``$BUCKETPOOL_VLLM_SITE`` is set: then the
tests fail.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _vllm_standin as standin
import numpy as np
import pytest
import test_vllm_hisparse as spill
import torch
from test_vllm_tests import FILES, outcomes, vllms_own

from bucketpool._hook import HookPool
from bucketpool.testing import swap_blocks_batch
from bucketpool.vllm import descriptor_pool_factory

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "upstream" / "vllm-0.34.0-descriptor-pool.patch"
PATCHED = "0.34.0"  # the vLLM the patch is for
#: The call site each of vLLM's test files builds its pools for.
SITES = {
    "v1/ec_connector/unit/cpu/worker/test_worker.py": "ec_cpu",
    "v1/kv_offload/cpu/test_gpu_worker.py": "kv_offload",
}


def site_of(version: str) -> Path:
    """The site of the vLLM *version* among those tested; skipped without it (failed if named)."""
    for site in standin.vllm_sites():
        if standin.vllm_version(site) == version:
            return site
    if standin.SITE_VARIABLE in os.environ:
        raise FileNotFoundError(f"{standin.SITE_VARIABLE} names no vLLM {version}: run .ci/setup")
    pytest.skip(f"no vLLM {version}: run .ci/setup")


def apply(site: Path, into: Path) -> Path:
    """Copy the vLLM in *site* to *into* and apply the patch there; return *into*.

    Files are copied as links to *site*'s, but those the patch changes, which are copied
    (``git apply`` replaces them, and would refuse a link).

    Raises:
        AssertionError: the patch does not apply cleanly: it is for vLLM 0.34.0.
    """
    changed = re.findall(r"^\+\+\+ b/(\S+)$", PATCH.read_text(encoding="utf-8"), re.MULTILINE)
    shutil.copytree(site, into, symlinks=True, copy_function=os.symlink)
    for name in changed:
        if (into / name).is_symlink():
            (into / name).unlink()
            shutil.copyfile(site / name, into / name)
    environment = {**os.environ, "GIT_CEILING_DIRECTORIES": str(into.parent)}
    run = subprocess.run(
        ["git", "apply", "--verbose", str(PATCH)],
        cwd=into,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, (
        f"{PATCH.name} does not apply to vLLM {standin.vllm_version(site)} in {site}; it is "
        f"for vLLM {PATCHED}:\n{run.stderr}"
    )
    return into


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of vLLM 0.34.0's site with the patch applied."""
    return apply(site_of(PATCHED), tmp_path_factory.mktemp("patched") / "site")


def test_the_patch_applies_cleanly_to_vllm_0_34_0(patched: Path) -> None:
    hook = (patched / "vllm" / "utils" / "descriptor_pool.py").read_text(encoding="utf-8")
    worker = (patched / "vllm" / "v1" / "kv_offload" / "cpu" / "gpu_worker.py").read_text()

    assert "def set_descriptor_pool_factory(" in hook
    assert "_new_descriptor_buffers" not in worker
    assert not (site_of(PATCHED) / "vllm" / "utils" / "descriptor_pool.py").exists()


def test_the_patch_is_refused_by_another_vllm(tmp_path: Path) -> None:
    older = site_of("0.33.0")

    with pytest.raises(AssertionError, match=re.escape("does not apply to vLLM 0.33.0")) as refused:
        apply(older, tmp_path / "site")

    assert f"it is for vLLM {PATCHED}" in str(refused.value)
    assert "patch does not apply" in str(refused.value)  # git's own refusal
    assert not (tmp_path / "site" / "vllm" / "utils" / "descriptor_pool.py").exists()


@pytest.mark.parametrize("install", ["", "plugin"], ids=["vllm-pool", "bucketpool-plugin"])
@pytest.mark.parametrize("test_file", FILES)
def test_vllms_own_tests_pass_the_same_on_the_patched_vllm(
    patched: Path, test_file: str, install: str, tmp_path: Path
) -> None:
    site = site_of(PATCHED)
    path = standin.test_file(site, test_file)
    own = vllms_own(site, path, tmp_path)

    tests = site.parent / "tests"
    found = outcomes(patched, path, install, tmp_path / "patched.xml", tests=tests)
    report = json.loads((tmp_path / "patched.json").read_text(encoding="utf-8"))

    assert found == own
    assert "passed" in own.values(), own
    assert report["hook"] is True
    assert report["files"], report  # vLLM's workers ran from the patched copy
    assert all(Path(file).is_relative_to(patched) for file in report["files"]), report
    assert report["rebound"] == []
    assert report["installed"] is False
    if install:  # bucketpool's factory, set by the plugin, made the pools vLLM's tests used
        assert report["factory"].startswith("bucketpool._hook.serving"), report
        assert report["pools"].get(SITES[test_file], 0) > 0, report
    else:
        assert report["factory"] is None
        assert report["pools"] == {}


@pytest.fixture(scope="module")
def hook(patched: Path) -> Iterator[types.ModuleType]:
    """The patched vLLM's ``vllm.utils.descriptor_pool``, over the host stand-in."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        before = {name for name in sys.modules if name.partition(".")[0] == "vllm"}
        standin.install_standin(monkeypatch, eager=True, site=patched)
        try:
            yield importlib.import_module("vllm.utils.descriptor_pool")
        finally:
            for name in [n for n in sys.modules if n.partition(".")[0] == "vllm"]:
                if name not in before:
                    del sys.modules[name]


class EndEvent:
    """A copy's end event: done once told, or synchronized (it counts them); records nothing."""

    def __init__(self, *, lost: bool = False) -> None:
        self.done = False
        self.lost = lost  # a device fault: query() raises RuntimeError
        self.synchronized = 0

    def query(self) -> bool:
        if self.lost:
            raise RuntimeError("device lost")
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        self.done = True

    def record(self, stream: object = None) -> None:
        pass


def make_pool(hook: types.ModuleType, which: str, aliased: bool) -> Any:
    """vLLM's default pool, or bucketpool's factory's, for a spec of int64 descriptors."""
    spec = hook.DescriptorSpec(name="test", dtype=torch.int64, aliased=aliased)
    if which == "vllm":
        return hook.BucketedDescriptorPool(spec)
    return descriptor_pool_factory(spec)


def holds_nothing(pool: Any) -> bool:
    """Whether *pool* keeps no buffer, idle or parked."""
    if isinstance(pool, HookPool):
        return pool.pool.stats().allocations.current == 0
    return bool(pool._pool == [] and pool._parked == [])


POOLS = pytest.mark.parametrize("which", ["vllm", "bucketpool"])
SHAPES = pytest.mark.parametrize("aliased", [True, False], ids=["aliased", "triple"])


@POOLS
@SHAPES
def test_a_pool_hands_out_what_the_spec_asks_for(
    hook: types.ModuleType, which: str, aliased: bool
) -> None:
    pool = make_pool(hook, which, aliased)
    bufs = pool.acquire(5)

    if aliased:
        assert bufs._fields == hook.DescriptorBuffers._fields
        bufs.add_copies(1, [0x1000, 0x2000], [0x3000, 0x4000], [64, 128])
        assert bufs.sizes[1:3].tolist() == [64, 128]
    else:
        assert len(bufs) == 3
    assert all(t.dtype == torch.int64 and t.numel() >= 5 for t in bufs[:3])
    pool.release(bufs)


@POOLS
@SHAPES
def test_an_end_event_parks_the_buffer_and_collect_retires_it(
    hook: types.ModuleType, which: str, aliased: bool
) -> None:
    pool = make_pool(hook, which, aliased)
    bufs = pool.acquire(5)
    address = bufs[0].data_ptr()
    event = EndEvent()
    pool.release(bufs, end_event=event)
    del bufs

    other = pool.acquire(5)  # the parked buffer is alive, so this is another
    assert other[0].data_ptr() != address
    pool.release(other)
    pool.collect()  # not done: still parked
    again = pool.acquire(5)
    assert again[0].data_ptr() != address
    pool.release(again)
    event.done = True
    pool.collect()
    back = pool.acquire(5)

    assert back[0].data_ptr() == address
    pool.release(back)


@POOLS
@SHAPES
def test_an_end_event_that_raises_keeps_the_buffer_parked(
    hook: types.ModuleType, which: str, aliased: bool
) -> None:
    pool = make_pool(hook, which, aliased)
    bufs = pool.acquire(5)
    address = bufs[0].data_ptr()
    lost = EndEvent(lost=True)

    pool.release(bufs, end_event=lost)  # neither raises: the copy may still run
    del bufs
    pool.collect()
    other = pool.acquire(5)

    assert other[0].data_ptr() != address
    pool.release(other)
    lost.lost = False  # the device answers again: done once synchronized
    pool.shutdown()
    assert lost.synchronized == 1


@POOLS
@SHAPES
def test_shutdown_waits_for_parked_buffers_and_drops_every_buffer(
    hook: types.ModuleType, which: str, aliased: bool
) -> None:
    pool = make_pool(hook, which, aliased)
    parked, idle = pool.acquire(5), pool.acquire(300)
    pending = EndEvent()
    pool.release(parked, end_event=pending)
    pool.release(idle)
    del parked, idle

    pool.shutdown()

    assert pending.synchronized == 1
    assert holds_nothing(pool)


class Stream:
    """A stream of the HiSparse worker's: a context; nothing to wait for on the host."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass


@POOLS
def test_the_patched_hisparse_worker_spills_through_its_pool(
    hook: types.ModuleType, which: str, patched: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in spill.IMPORTS[1:]:  # (vLLM itself is the stand-in's, over the patched copy)
        monkeypatch.setitem(sys.modules, name, spill._Stand(name))
    path = patched / "vllm" / spill.WORKER
    found = importlib.util.spec_from_file_location("_patched_hisparse_worker", path)
    assert found is not None
    assert found.loader is not None
    module = importlib.util.module_from_spec(found)
    monkeypatch.setitem(sys.modules, found.name, module)
    found.loader.exec_module(module)
    monkeypatch.setattr(torch, "Event", EndEvent)  # done when the test says
    monkeypatch.setattr(torch.accelerator, "current_stream", Stream)
    rng = np.random.default_rng(5)
    vars(module).setdefault("_allocate_dma_descriptors", None)  # (make_worker reads it; unused)
    worker = spill.make_worker(module, rng)
    worker._dma_descriptor_pool = make_pool(hook, which, aliased=True)
    copied: list[int] = []  # where each copy's descriptors are

    def copy(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        copied.append(src.data_ptr())
        swap_blocks_batch(src, dst, sizes)

    copies = types.SimpleNamespace(swap_blocks_batch=copy)
    vars(worker).update(
        dma_stream=Stream(), backend=copies, host_write_event=EndEvent(), _dma_submitted=False
    )
    vars(worker).update(_pending_transfer_events=[], _enqueued_transfer_ids=[])
    methods = module.HiSparseConnectorWorker
    for name in ("_acquire_dma_descriptors", "_submit_dma_descriptors"):
        setattr(worker, name, getattr(methods, name).__get__(worker))
    transfers = spill.make_transfers(rng, 3)

    methods._enqueue_transfers(worker, transfers)  # acquire, fill, copy, release(end_event=)
    [(event, ids)] = worker._pending_transfer_events

    assert ids == (0, 1, 2)
    for layer, handle in enumerate(worker.cache_handles):  # every page spilled
        for transfer in transfers:
            block = transfer.resident_block_ids[handle.runtime.resident_source_index]
            row = transfer.host_block_id * spill.KERNEL_BLOCK_SIZE
            host = worker.host_caches[layer][row : row + spill.KERNEL_BLOCK_SIZE]
            assert torch.equal(host, worker.resident_caches[layer][block])
    other = worker._acquire_dma_descriptors(15)
    assert other.src_ptrs.data_ptr() != copied[0]  # the spill's buffer is parked
    worker._dma_descriptor_pool.release(other)
    event.done = True
    methods._release_completed_dma_descriptors(worker)  # collect()
    again = worker._acquire_dma_descriptors(15)
    assert again.src_ptrs.data_ptr() == copied[0]  # retired, and reused
    worker._dma_descriptor_pool.release(again)
    worker._dma_descriptor_pool.shutdown()
