"""Integration test: vLLM's real EC CPU worker, with its own pool and with ``install()``.

Runs for each ``vllm`` package found (``_vllm_standin.vllm_sites``): after ``.ci/setup``,
0.34.0's wheel (installed with ``--no-deps`` in ``.vllm/site``) and 0.33.0's modules (in
``.vllm/0.33.0/site``), or those ``$BUCKETPOOL_VLLM_SITE`` names, or an importable one;
skipped without any.
The worker runs on the host stand-in of ``_vllm_standin.py``: copies are queued and run in
order only when the test advances the device, so saves and loads stay in flight across
steps.  Every run is checked against a model of the region, and the run after
``bucketpool.vllm.install()`` must produce exactly what the run on vLLM's pool produced:
region bytes after every step, completions reported, bytes loaded.

vLLM's model runners call the connector's saves, flushes, loads and completion reports from
``execute_model``, which runs under ``@torch.inference_mode()``: every pool call but the
pool's construction happens in inference mode there.  The random-step test runs its steps
in torch's default mode, in inference mode, or each in one of the two at random; vLLM's pool
in the same modes as bucketpool's.  The zero-block test runs in either mode.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import sys
import types
import typing
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _vllm_standin as standin
import numpy as np
import numpy.typing as npt
import pytest
import torch

from bucketpool import compat
from bucketpool import vllm as bucketpool_vllm

HIDDEN = 8
DTYPE = torch.float16
BLOCK_BYTES = HIDDEN * DTYPE.itemsize
NUM_BLOCKS = 64


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}


@pytest.fixture(params=standin.site_params())
def vllm_site(request: pytest.FixtureRequest) -> Path:
    """Each vLLM found, the newest first."""
    return typing.cast("Path", request.param)


@pytest.fixture(params=[False, True], ids=["int64", "xpu-uint64"])
def worker_module(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, vllm_site: Path
) -> Iterator[types.ModuleType]:
    """vLLM's real worker module over the stand-in; everything is undone afterwards."""
    before = _vllm_names()
    standin.install_standin(monkeypatch, eager=False, xpu=request.param, site=vllm_site)
    try:
        yield importlib.import_module(standin.WORKER)
    finally:
        bucketpool_vllm.uninstall()
        for name in _vllm_names() - before:  # imported during the test; monkeypatch restores
            sys.modules.pop(name, None)  # the rest after this


def make_worker(module: types.ModuleType, worker_class: type | None = None) -> Any:
    """An ECCPUWorker (or *worker_class*) over a fresh 64-block region, built by vLLM's own
    region factory."""
    config = types.SimpleNamespace(
        instance_id=f"bucketpool-{uuid.uuid4().hex}",
        parallel_config=types.SimpleNamespace(data_parallel_index=0),
        model_config=types.SimpleNamespace(dtype=DTYPE, get_inputs_embeds_size=lambda: HIDDEN),
        ec_transfer_config=types.SimpleNamespace(
            ec_connector_extra_config={"ec_cpu_bytes": NUM_BLOCKS * BLOCK_BYTES}
        ),
    )
    return (worker_class or module.ECCPUWorker)(config)


def metadata(
    module: types.ModuleType,
    saves: dict[str, list[int]] | None = None,
    loads: dict[str, tuple[int, list[int], tuple[int, int]]] | None = None,
) -> Any:
    common = sys.modules["vllm.distributed.ec_transfer.ec_connector.cpu.common"]
    return common.ECCPUConnectorMetadata(saves=saves or {}, loads=loads or {})


#: How a run's steps go: all in torch's default mode, all in inference mode (as in vLLM),
#: or each in one of the two at random (buffers made in one mode, handed out in the other).
MODES = ["default-mode", "inference-mode", "mixed"]


def inference_steps(mode: str, seed: int, steps: int) -> list[bool]:
    """Whether each step, and the final report after them, runs in inference mode."""
    if mode == "mixed":
        rng = random.Random(f"mode-{seed}")
        return [rng.random() < 0.5 for _ in range(steps + 1)]
    return [mode == "inference-mode"] * (steps + 1)


def step_mode(inference: bool) -> contextlib.AbstractContextManager[object]:
    """A step's context: ``execute_model``'s ``torch.inference_mode()``, or nothing."""
    return torch.inference_mode() if inference else contextlib.nullcontext()


def run_steps(module: types.ModuleType, seed: int, steps: int, mode: str) -> list[object]:
    """Drive one worker through random steps; return what it did, checked against a model.

    The worker is made outside any step, as vLLM makes it; each step's saves, flush, loads,
    device progress and completion report run in the step's mode (see `inference_steps`).
    """
    rng = random.Random(seed)
    inference = inference_steps(mode, seed, steps)
    device = standin.device()
    worker = make_worker(module)
    blocks = worker._region.blocks
    model: npt.NDArray[np.uint8] = blocks.view(torch.uint8).numpy().copy()
    keep: list[torch.Tensor] = []  # sources and load destinations must outlive their copies
    loaded: list[tuple[torch.Tensor, npt.NDArray[np.uint8]]] = []
    trace: list[object] = []
    next_id = 0
    try:
        for step in range(steps):
            with step_mode(inference[step]):  # one execute_model call
                # Saves: 0-3 entries, some with a partial last block or blocks past the output.
                entries = rng.randint(0, 3)
                sizes = [
                    (rng.randint(1, 4), rng.choice((0, 0, 3)), rng.choice((0, 0, 1)))
                    for _ in range(entries)
                ]
                ids = rng.sample(range(NUM_BLOCKS), sum(rows + extra for rows, _, extra in sizes))
                saves: dict[str, list[int]] = {}
                cache: dict[str, torch.Tensor] = {}  # encoder outputs, made in the step's mode
                for index, (rows, short, extra) in enumerate(sizes):
                    name = f"s{step}.{index}"
                    saves[name], ids = ids[: rows + extra], ids[rows + extra :]
                    values = [rng.randrange(-2048, 2048) for _ in range(rows * HIDDEN - short)]
                    cache[name] = torch.tensor(values, dtype=DTYPE)
                meta = metadata(module, saves=saves)
                for name, source in cache.items():
                    worker.save_caches(cache, name, meta)
                    data = source.view(torch.uint8).numpy()
                    for slot, block in enumerate(saves[name][: -(-data.size // BLOCK_BYTES)]):
                        chunk = data[slot * BLOCK_BYTES : (slot + 1) * BLOCK_BYTES]
                        model[block, : chunk.size] = chunk
                keep.extend(cache.values())
                worker.flush_saves()
                # Loads: 0-2 entries of 1-4 blocks each, read when their copy runs.
                loads: dict[str, tuple[int, list[int], tuple[int, int]]] = {}
                for _ in range(rng.choice((0, 0, 1, 2))):
                    picked = rng.sample(range(NUM_BLOCKS), rng.randint(1, 4))
                    loads[f"l{next_id}"] = (next_id, picked, (len(picked), HIDDEN))
                    next_id += 1
                out: dict[str, torch.Tensor] = {}
                worker.start_load_caches(out, metadata(module, loads=loads))
                for name, (_, picked, _) in loads.items():
                    keep.append(out[name])
                    loaded.append((out[name], model[picked].reshape(-1).copy()))
                # Let some copies run, then ask what finished.
                if rng.random() < 0.2:
                    device.drain()
                else:
                    device.advance(rng.randint(0, 2))
                report = worker.build_connector_worker_meta()
            # The worker made its load destinations in the step's mode: the step had it.
            made_in = {name: out[name].is_inference() for name in loads}
            assert all(made is inference[step] for made in made_in.values()), made_in
            done = None if report is None else (report.completed_saves, report.completed_loads)
            trace.append((step, done, blocks.view(torch.uint8).numpy().tobytes()))
        with step_mode(inference[steps]):
            device.drain()
            report = worker.build_connector_worker_meta()
        trace.append(None if report is None else (report.completed_saves, report.completed_loads))
        assert not worker._inflight_saves
        assert not worker._inflight_loads
        np.testing.assert_array_equal(blocks.view(torch.uint8).numpy(), model)
        for tensor, expected in loaded:
            np.testing.assert_array_equal(tensor.reshape(-1).view(torch.uint8).numpy(), expected)
            trace.append(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        trace.append(type(worker._buf_pool))
    except BaseException:
        give_back_held(worker)
        raise
    finally:
        worker.shutdown()
    return trace


def give_back_held(worker: Any) -> None:
    """Run what a failed run left queued, and release every buffer the worker still holds.

    vLLM's ``shutdown`` drops them unreleased; bucketpool would then report each as a leak
    from a finaliser, during whichever later test the garbage collector runs in.
    """
    standin.device().drain()
    held = [transfer.bufs for transfer in (*worker._inflight_saves, *worker._inflight_loads)]
    if worker._save_bufs is not None:
        held.append(worker._save_bufs)
    worker._inflight_saves.clear()
    worker._inflight_loads.clear()
    worker._save_bufs = None
    for bufs in held:
        worker._buf_pool.release(bufs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_steps_match_vllms_own_pool(
    worker_module: types.ModuleType, seed: int, mode: str
) -> None:
    """Saves and loads through ``install()`` are byte-exact with vLLM's pool, step by step,
    in each mode (vLLM's ``execute_model`` runs them all under ``torch.inference_mode()``)."""
    vllms = worker_module.DescriptorBufferPool
    original = run_steps(worker_module, seed, steps=80, mode=mode)
    assert original[-1] is vllms

    bucketpool_vllm.install()  # after the worker module was imported: rebinds it there too

    assert bucketpool_vllm.installed()
    adapted = run_steps(worker_module, seed, steps=80, mode=mode)
    assert adapted[-1] is worker_module.DescriptorBufferPool is not vllms
    assert adapted[:-1] == original[:-1]


def test_install_says_it_installed_on_a_vllm_it_was_tested_with(
    worker_module: types.ModuleType,
) -> None:
    """The wheel in use is one ``install()`` was tested with: it installs, and says so."""
    version = sys.modules["vllm"].__version__  # the wheel's: vllm/_version.py

    result = bucketpool_vllm.install()

    assert result == bucketpool_vllm.InstallResult(
        installed=True, vllm_version=version, tested=True
    )


def test_vllms_pool_after_install_is_a_class_with_vllms_dtype(
    worker_module: types.ModuleType,
) -> None:
    """``isinstance`` and a subclass work as on vLLM's class; XPU's uint64 is carried."""
    xpu = sys.modules["vllm.platforms"].current_platform.is_xpu()
    bucketpool_vllm.install()
    installed = worker_module.DescriptorBufferPool
    worker = make_worker(worker_module)

    class PluginPool(installed):  # type: ignore[misc, valid-type]  # as vllm-ascend writes it
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def acquire(self, n: int) -> Any:
            self.sizes.append(n)
            return super().acquire(n)

    try:
        assert isinstance(worker._buf_pool, installed)
        plugin = PluginPool()
        bufs = plugin.acquire(5)
        assert isinstance(bufs, compat.AliasedDescriptorBuffers)
        assert plugin.sizes == [5]
        expected = torch.uint64 if xpu else torch.int64
        assert [t.dtype for t in bufs[:3]] == [expected] * 3
        assert bufs.src_np.dtype == np.dtype(str(expected).removeprefix("torch."))
        plugin.release(bufs)
    finally:
        worker.shutdown()


@pytest.mark.parametrize("inference", [False, True], ids=["default-mode", "inference-mode"])
@pytest.mark.parametrize(
    "install",
    [False, True],
    ids=["vllm-pool", "installed"],
)
def test_zero_block_save_after_warm_up(
    worker_module: types.ModuleType, install: bool, inference: bool
) -> None:
    """A step whose only save has zero blocks keeps its buffer (flush_saves returns early);
    the next step's save must still fit, as it does on vLLM's pool once warmed up."""
    if install:
        bucketpool_vllm.install()
    worker = make_worker(worker_module)
    device = standin.device()
    failure = None
    try:
        for block in (0, 1):
            with step_mode(inference):
                source = torch.arange(HIDDEN, dtype=DTYPE)
                saves = {"h": [block]}
                worker.save_caches({"h": source}, "h", metadata(worker_module, saves=saves))
                worker.flush_saves()
                device.drain()
                assert worker.build_connector_worker_meta() is not None
        with step_mode(inference):
            empty = torch.empty(0, dtype=DTYPE)
            worker.save_caches({"e": empty}, "e", metadata(worker_module, saves={"e": []}))
            worker.flush_saves()  # nothing to copy: returns early and keeps the open buffer
        with step_mode(inference):
            try:
                worker.save_caches({"h": source}, "h", metadata(worker_module, saves={"h": [2]}))
            except AssertionError:  # the worker's capacity check; keep no traceback alive
                failure = f"save_caches failed the capacity assert: {worker._save_bufs.src_ptrs!r}"
            else:
                worker.flush_saves()
                device.drain()
                worker.build_connector_worker_meta()
                assert torch.equal(worker._region.blocks[2].view(DTYPE), source)
    finally:
        give_back_held(worker)  # what the failed step left open
        worker.shutdown()
    assert failure is None, failure


def test_shutdown_with_copies_in_flight_gives_every_triple_back(
    worker_module: types.ModuleType,
) -> None:
    """vLLM's ``shutdown`` synchronises its copies and drops their triples: with ``install()``
    they come back to the pool, with no leak warning."""
    bucketpool_vllm.install()
    worker = make_worker(worker_module)
    source = torch.arange(HIDDEN, dtype=DTYPE)
    worker.save_caches({"h": source}, "h", metadata(worker_module, saves={"h": [0]}))
    worker.flush_saves()  # in flight: the device runs nothing until told
    loads = {"l": (0, [5, 6], (2, HIDDEN))}
    out: dict[str, torch.Tensor] = {}  # the destination outlives its copy
    worker.start_load_caches(out, metadata(worker_module, loads=loads))
    worker.save_caches({"h": source}, "h", metadata(worker_module, saves={"h": [1]}))  # open
    assert standin.device().done < standin.device().submitted
    expected = worker._region.blocks[[5, 6]].reshape(-1).view(torch.uint8).clone()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.shutdown()

    assert [str(warning.message) for warning in caught] == []
    assert standin.device().done == standin.device().submitted  # vLLM's shutdown waited
    stats = worker._buf_pool.pool.stats()
    assert (stats.leaks, stats.active_requests.current, stats.parked_bytes) == (0, 0, 0)
    assert torch.equal(out["l"].reshape(-1).view(torch.uint8), expected)
