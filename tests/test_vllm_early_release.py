"""vLLM's real workers after ``install()``: a release before the copy ended (issue 35).

``install()`` wraps the ``swap_blocks_batch`` op vLLM's workers call, so each copy of a
pool's descriptors gets an end event on its hand-out.  vLLM's own workers release only
after their end event fired: never reported, though every copy was recorded.  vllm-ascend
#13894 released the EC worker's descriptors in a ``finally`` right after the swap: rebuilt
here as a subclass of vLLM's real worker, over the host stand-in whose copies read their
descriptors when they run, it copies the wrong bytes on vLLM's pool and the right ones on
bucketpool's, which parks the buffer until the copy ran and, at ``checks``, names the line.
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import _vllm_standin as standin
import pytest
import test_kv_offload
import test_vllm_real
import torch

from bucketpool import DebugLevel, InFlightReleaseWarning, ReleaseError, _copies
from bucketpool import vllm as bucketpool_vllm


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] in ("vllm", "vllm_ascend")}


@pytest.fixture(params=standin.site_params())
def standin_vllm(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[pytest.MonkeyPatch]:
    """Each vLLM over the stand-in (EC and KV workers); everything is undone afterwards."""
    before = _vllm_names()
    standin.install_kv_standin(monkeypatch, eager=False, site=request.param)
    try:
        yield monkeypatch
    finally:
        bucketpool_vllm.uninstall()
        for name in _vllm_names() - before:
            sys.modules.pop(name, None)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each copy the installed op saw was recorded on a hand-out."""
    seen: list[bool] = []
    original = _copies.begun

    def spy(*args: Any) -> _copies.Copy | None:
        copy = original(*args)
        seen.append(copy is not None)
        return copy

    monkeypatch.setattr(_copies, "begun", spy)
    return seen


def test_vllms_ec_worker_is_never_reported(
    standin_vllm: pytest.MonkeyPatch, recorded: list[bool]
) -> None:
    standin_vllm.setenv("BUCKETPOOL_DEBUG", "checks")
    assert bucketpool_vllm.install().installed
    module = importlib.import_module(standin.WORKER)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        for seed in range(3):
            test_vllm_real.run_steps(module, seed, steps=40, mode="inference-mode")
    assert recorded.count(True) > 40  # its saves and loads: each copy had its end event


def test_vllms_kv_handlers_are_never_reported(
    standin_vllm: pytest.MonkeyPatch, recorded: list[bool]
) -> None:
    standin_vllm.setenv("BUCKETPOOL_DEBUG", "checks")
    assert bucketpool_vllm.install(kv_offload=True).installed
    module = importlib.import_module(standin.KV_WORKER)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InFlightReleaseWarning)
        submitted = test_kv_offload.run_trace(module, seed=0, steps=60, blocks_per_chunk=1)
    assert recorded.count(True) == submitted


def releasing_in_finally(module: types.ModuleType) -> type:
    """vLLM's EC worker with vllm-ascend #13894's load: released right after the swap."""

    class ReleasingWorker(module.ECCPUWorker):  # type: ignore[name-defined,misc]
        def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], metadata: Any) -> None:
            block = self._region.block_size_bytes
            src_base = self._region.blocks.data_ptr()
            for name, (_, block_ids, _) in metadata.loads.items():
                dst = encoder_cache[name] = torch.empty(len(block_ids), block, dtype=torch.int8)
                bufs = self._buf_pool.acquire(len(block_ids))
                for slot, block_id in enumerate(block_ids):
                    bufs.src_np[slot] = src_base + block_id * block
                    bufs.dst_np[slot] = dst.data_ptr() + slot * block
                    bufs.sizes_np[slot] = block
                with module.current_platform.stream(self._acquire_stream()):
                    try:
                        self._submit_transfer(bufs, len(block_ids), host_to_device(module))
                    finally:
                        self._buf_pool.release(bufs)  # RELEASE: the copy has not run

    return ReleasingWorker


def host_to_device(module: types.ModuleType) -> Any:
    return module.ECCPUTransferDirection.HOST_TO_DEVICE


def two_loads(module: types.ModuleType, out: dict[str, torch.Tensor]) -> bool:
    """Load two entries in one step, then let the copies run: is the first one's data right?

    *out* gets each entry's destination, and ``"expected"`` the first one's region bytes.
    """
    worker = test_vllm_real.make_worker(module, releasing_in_finally(module))
    try:
        region = worker._region.blocks.view(torch.uint8)  # (let go before shutdown unmaps it)
        region.copy_(torch.randint(0, 256, region.shape, dtype=torch.uint8))
        out["expected"] = region[[1, 2]]
        del region
        loads = {"a": (0, [1, 2], (2, 8)), "b": (1, [5, 6], (2, 8))}
        with torch.inference_mode():
            worker.start_load_caches(out, test_vllm_real.metadata(module, loads=loads))
    finally:
        standin.device().drain()  # the copies run (into *out*, alive here)
        worker.shutdown()
    return torch.equal(out["a"].view(torch.uint8), out["expected"])


def test_without_bucketpool_13894_copies_the_wrong_bytes(
    standin_vllm: pytest.MonkeyPatch,
) -> None:
    module = importlib.import_module(standin.WORKER)
    assert not two_loads(module, {})  # vLLM's pool handed the triple on: the next load rewrote it


@pytest.mark.parametrize("level", ["off", "checks", "strict"])
def test_with_bucketpool_13894_copies_the_right_bytes_and_checks_names_the_line(
    standin_vllm: pytest.MonkeyPatch, level: DebugLevel
) -> None:
    standin_vllm.setenv("BUCKETPOOL_DEBUG", level)
    assert bucketpool_vllm.install().installed
    module = importlib.import_module(standin.WORKER)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if level == "strict":  # raised from the first load's finally, after parking
            out: dict[str, torch.Tensor] = {}
            with pytest.raises(ReleaseError, match="could still read its descriptors"):
                two_loads(module, out)
            assert torch.equal(out["a"].view(torch.uint8), out["expected"])
            return
        assert two_loads(module, {})
    early = [w for w in caught if issubclass(w.category, InFlightReleaseWarning)]
    if level == "off":
        assert early == []
        return
    (warning,) = early  # the second load's release: the same pair of lines, reported once
    lines = pathlib.Path(__file__).read_text(encoding="utf-8").splitlines()
    release_line = next(i for i, text in enumerate(lines, 1) if "# RELEASE:" in text)
    assert (warning.filename, warning.lineno) == (__file__, release_line)
    assert f"{module.__file__}:" in str(warning.message)  # where vLLM's worker began the copy


def test_install_wraps_vllms_copy_op_where_it_is_bound_and_uninstall_unwraps_it(
    standin_vllm: pytest.MonkeyPatch,
) -> None:
    worker = importlib.import_module(standin.WORKER)
    ops = sys.modules["vllm._custom_ops"]
    original = ops.swap_blocks_batch
    assert worker.swap_blocks_batch is original
    assert bucketpool_vllm.install(kv_offload=True).installed
    wrapped = worker.swap_blocks_batch
    assert wrapped is not original
    assert ops.swap_blocks_batch is wrapped
    assert wrapped.__wrapped__ is original  # (functools.wraps: vLLM's name and docstring)
    late = types.ModuleType("vllm.late_import")  # a module bound it since the install
    late.swap_blocks_batch = wrapped  # type: ignore[attr-defined]
    standin_vllm.setitem(sys.modules, late.__name__, late)
    bucketpool_vllm.uninstall()
    assert worker.swap_blocks_batch is original
    assert ops.swap_blocks_batch is original
    assert late.swap_blocks_batch is original


@pytest.mark.parametrize("two_calls", [False, True], ids=["one-call", "two-calls"])
def test_the_kv_offloads_triton_op_is_wrapped_however_install_is_called(
    standin_vllm: pytest.MonkeyPatch, two_calls: bool
) -> None:
    name = "vllm.v1.kv_offload.cpu.swap_blocks_triton"
    triton = sys.modules[name]
    original = triton.swap_blocks_batch
    assert original is not sys.modules["vllm._custom_ops"].swap_blocks_batch
    if two_calls:  # BUCKETPOOL_VLLM=ec, then a KV worker's import: Triton's module comes late
        standin_vllm.delitem(sys.modules, name)
        assert bucketpool_vllm.install().installed
        standin_vllm.setitem(sys.modules, name, triton)
    assert bucketpool_vllm.install(kv_offload=True).installed  # imports the KV worker
    bound = sys.modules[standin.KV_WORKER].swap_blocks_batch
    assert bound.__wrapped__ is original
    bucketpool_vllm.uninstall()
    assert sys.modules[standin.KV_WORKER].swap_blocks_batch is original
