"""The host-step cases: vLLM's real workers, with their own pools and after ``install()``.

What a vLLM user feels is the host time of the worker's step, not of the pool alone.  Each
case loads vLLM's real worker module twice, over the host stand-in of `bench._vllm_host`
(the wheel ``.ci/setup`` installs): one copy as vLLM ships it, one served by
``bucketpool.vllm.install()`` (which sees only that copy), so both run the same code but
for the pool.  Step by step, interleaved, in random order, each worker runs the same
planned step under ``torch.inference_mode()`` (vLLM's ``execute_model``), timed in thread
CPU time with the collector off; a round's sample is its steps' mean.  The stand-in's
copies run on the host, inside the step, as in vLLM's own tests hosted here
(``tests/vllm_plugin.py``); ``installed - vllm`` is the extra host time per step, which a
GPU host pays whatever its copies cost.

- ``host-ec-small`` and ``host-ec-large``: the EC CPU worker's step (``start_load_caches``,
  ``save_caches`` per entry, ``flush_saves``, ``build_connector_worker_meta``), 1-4 saves
  and 1-4 loads a step, each of 1-8 blocks of 64 B, or of 16-256 blocks of 8 KiB, at
  ascending ids with gaps (a fragmented cache: most blocks are a descriptor of their
  own); each copy runs as it is submitted.
- ``host-kv``: the KV-offload handlers (the worker's ``submit_store`` or ``submit_load``,
  whose handler's ``transfer_async`` copies log-uniform 1-512 blocks over 4 tensors, the
  device running copies until 1-3 are left in flight, then ``get_finished``).

Each case also times vLLM's copy against itself, as a control (``vllm/vllm``), and the
installed copy with vLLM's op unwrapped during its steps (``unrecorded``): the difference,
per copy, is what recording each copy's end event costs (``record ns/copy``, issue 35).
"""

from __future__ import annotations

import functools
import gc
import importlib
import math
import random
import sys
import time
import types
import typing
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench import _vllm_host as host
from bench._stats import Measurement, median_of, paired_ratios, relative_spread, summarize
from bench._targets import HOST_STEP
from bucketpool import _copies
from bucketpool import vllm as bucketpool_vllm

__all__ = [
    "CONTROL",
    "EXTRA",
    "HOST_RESOLUTION",
    "HOST_STEP",
    "RECORD",
    "EcStepCase",
    "KvStepCase",
    "host_step_cases",
]

#: vLLM's copy against itself: what the method cannot tell apart (the ratio's resolution).
CONTROL = "vllm/vllm"
#: The host time ``install()`` adds to a step.
EXTRA = "installed - vllm ns/step"
#: What recording each copy's end event costs (issue 35): the installed step against the
#: same with vLLM's op unwrapped, per copy.
RECORD = "record ns/copy"
#: The least relative half-width of the ratio's interval: step-by-step interleaving leaves
#: less drift than rounds of passes do (`bench._stats.RESOLUTION`); the control widens it.
HOST_RESOLUTION = 0.01
_EC_REGIMES = {"small": (1, 8, 64, 4_096), "large": (16, 256, 8_192, 2_048)}  # blocks, bytes
_KV_PAGES = (256, 256, 512, 512)  # bytes per block of each of the 4 KV tensors
_KV_BLOCKS, _KV_LARGEST = 2_048, 512
Step = Callable[[], object]


def _vllm_names() -> set[str]:
    return {name for name in sys.modules if name.partition(".")[0] in ("vllm", "vllm_ascend")}


class _HostStepCase:
    """Two copies of a vLLM worker module, one installed, stepped in turn (a `Case`)."""

    def __init__(self, name: str, description: str, steps: int, kv: bool) -> None:
        self.name = name
        self.description = description
        self.samples: dict[str, list[float]] = {}
        self._steps = steps
        self._kv = kv
        self._patches = pytest.MonkeyPatch()
        self._before: set[str] = set()
        self._workers: dict[str, Any] = {}
        self._devices: dict[str, host.HostDevice] = {}
        self._round = 0
        self._ops: list[tuple[types.ModuleType, str, object, object]] = []
        self._copies: dict[str, int] = {}

    def setup(self) -> None:
        """Load the module twice, install into the second, make the workers, warm up."""
        locations = host.vllm_locations()
        if locations is None:
            raise RuntimeError("no vLLM wheel: run .ci/setup (it installs one in .vllm/site)")
        self._before = _vllm_names()
        stand_in = host.install_kv_standin if self._kv else host.install_standin
        stand_in(self._patches, locations, eager=False)
        stubs = _vllm_names()
        name = host.KV_WORKER if self._kv else host.WORKER
        own = self.load(name)
        for loaded in _vllm_names() - stubs:  # hidden: install() sees the second copy only
            self._patches.delitem(sys.modules, loaded)
        installed = self.load(name)
        self._workers = {"vllm": self.make(own), "control": self.make(own)}  # (unwrapped op)
        bucketpool_vllm.install(kv_offload=self._kv)
        self._workers["installed"] = self.make(installed)
        self._workers["unrecorded"] = self.make(installed)
        self._ops = [  # where the installed copy binds the op install() wrapped: unwrapped
            (module, key, value.__wrapped__, value)  # during the unrecorded worker's steps
            for module in installed.values()
            for key, value in vars(module).items()
            if _recording(value)
        ]
        self._unrecord(self._workers["unrecorded"])
        self._devices = {name: host.HostDevice(eager=not self._kv) for name in self._workers}
        self.samples = {name: [] for name in self._workers}
        self._copies = dict.fromkeys(self._workers, 0)
        for _ in range(2):  # warm: every pool has what a round asks of it
            self._pass(random.Random(f"{self.name}-warm"), record=False)
        gc.collect()

    def load(self, name: str) -> dict[str, types.ModuleType]:
        """Import the worker module *name*; return the vLLM modules its copy uses."""
        importlib.import_module(name)
        return {each: sys.modules[each] for each in _vllm_names()}

    def make(self, modules: dict[str, types.ModuleType]) -> Any:
        """A worker of the copy of vLLM in *modules*."""
        raise NotImplementedError

    def prepare(self, worker: Any, plan: Any) -> Any:
        """*plan* in *worker*'s own vLLM classes (untimed)."""
        return plan

    def plan(self, rng: random.Random) -> Any:
        """One step's work, drawn from *rng*."""
        raise NotImplementedError

    def step(self, worker: Any, plan: Any) -> object:
        """Run *plan* on *worker* (timed); return what copies still to run write into."""
        raise NotImplementedError

    def round(self) -> None:
        """One pass of interleaved steps; each series' mean ns per step."""
        self._round += 1
        self._pass(random.Random(f"{self.name}-{self._round}"), record=True)

    def _pass(self, rng: random.Random, record: bool) -> None:
        totals = dict.fromkeys(self._workers, 0)
        copies = dict.fromkeys(self._workers, 0)
        names = list(self._workers)
        enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.inference_mode():
                for _ in range(self._steps):
                    plan = self.plan(rng)
                    rng.shuffle(names)
                    for name in names:
                        worker, device = self._workers[name], self._devices[name]
                        host.use_device(device)
                        args = self.prepare(worker, plan)
                        for module, key, plain, wrapped in self._ops:
                            setattr(module, key, plain if name == "unrecorded" else wrapped)
                        submitted = device.submitted
                        start = time.thread_time_ns()
                        written = self.step(worker, args)
                        totals[name] += time.thread_time_ns() - start
                        copies[name] += device.submitted - submitted
                        del written  # (the copies into it have run)
        finally:
            if enabled:
                gc.enable()
        for module, key, _, wrapped in self._ops:
            setattr(module, key, wrapped)
        if record:
            for name, total in totals.items():
                self.samples[name].append(total / self._steps)
                self._copies[name] += copies[name]

    def _unrecord(self, worker: Any) -> None:
        """Let *worker*'s copies go unrecorded where it holds the op itself (KV handlers)."""

    def close(self) -> None:
        """Let every copy finish and every worker give its buffers back; undo the loading."""
        if self._workers:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # nothing leaks here; never fail a report
                for name, worker in self._workers.items():
                    host.use_device(self._devices[name])
                    self._devices[name].drain()
                    self.finish(worker)
                self._workers = {}
                gc.collect()
        bucketpool_vllm.uninstall()
        self._patches.undo()
        for name in _vllm_names() - self._before:
            sys.modules.pop(name, None)

    def finish(self, worker: Any) -> None:
        """Report the finished copies and shut *worker* down."""
        raise NotImplementedError

    def measurements(self) -> dict[str, Measurement]:
        """The installed step over vLLM's, the control, the extra ns, each one's ns per step.

        The ratio's interval is at least as wide as the control is off 1 (the method's own
        error in this run), and at least `HOST_RESOLUTION`.
        """
        samples = self.samples
        if not samples.get("vllm"):
            return {}
        own, spread = samples["vllm"], relative_spread(samples["vllm"])
        control = summarize(
            paired_ratios(samples["control"], own), "x", spread=spread, resolution=HOST_RESOLUTION
        )
        resolution = max(HOST_RESOLUTION, abs(control.value - 1))
        extra = [ours - theirs for ours, theirs in zip(samples["installed"], own, strict=True)]
        per_step = self._copies["installed"] / (len(own) * self._steps)  # copies a step
        recording = [
            (ours - plain) / per_step
            for ours, plain in zip(samples["installed"], samples["unrecorded"], strict=True)
        ]
        return {
            HOST_STEP: summarize(
                paired_ratios(samples["installed"], own), "x", spread=spread, resolution=resolution
            ),
            CONTROL: control,
            EXTRA: summarize(extra, "ns", spread=spread, resolution=0),
            RECORD: summarize(recording, "ns", spread=spread, resolution=0),
            **{f"{name} ns/step": median_of(values) for name, values in samples.items()},
        }


@typing.final
class EcStepCase(_HostStepCase):
    """vLLM's ``ECCPUWorker`` step, its pool against ``install()`` (see the module)."""

    def __init__(self, regime: str, steps: int) -> None:
        low, high, block, blocks = _EC_REGIMES[regime]
        super().__init__(
            f"host-ec-{regime}",
            f"vLLM's ECCPUWorker step: 1-4 saves and 1-4 loads of {low}-{high} blocks of "
            f"{block:,} B; its pool vs install()",
            steps,
            kv=False,
        )
        self._low, self._high, self._block, self._blocks = low, high, block, blocks

    def make(self, modules: dict[str, types.ModuleType]) -> Any:
        """An ECCPUWorker over its own region of this regime's blocks."""
        config = types.SimpleNamespace(
            instance_id=f"bench-{uuid.uuid4().hex}",
            parallel_config=types.SimpleNamespace(data_parallel_index=0),
            model_config=types.SimpleNamespace(
                dtype=torch.float16, get_inputs_embeds_size=lambda: self._block // 2
            ),
            ec_transfer_config=types.SimpleNamespace(
                ec_connector_extra_config={"ec_cpu_bytes": self._blocks * self._block}
            ),
        )
        worker = modules[host.WORKER].ECCPUWorker(config)
        worker.bench_metadata = modules[f"{host.WORKER.rpartition('.')[0]}.common"]
        return worker

    def _ids(self, rng: random.Random, count: int) -> list[int]:
        """Ascending block ids with gaps, as a fragmented EmbeddingCache hands them out."""
        return sorted(rng.sample(range(self._blocks), count))

    def plan(self, rng: random.Random) -> Any:
        """The step's saves (with encoder outputs) and loads, as the scheduler sends them."""
        saves, cache, loads = {}, {}, {}
        for entry in range(rng.randint(1, 4)):
            count = rng.randint(self._low, self._high)
            name = f"s{entry}"
            saves[name] = self._ids(rng, count)
            cache[name] = torch.zeros(count * self._block // 2, dtype=torch.float16)
        for entry in range(rng.randint(1, 4)):
            ids = self._ids(rng, rng.randint(self._low, self._high))
            loads[f"l{entry}"] = (entry, ids, (len(ids), self._block // 2))
        return cache, saves, loads

    def prepare(self, worker: Any, plan: Any) -> Any:
        """The scheduler's metadata, of *worker*'s own class."""
        cache, saves, loads = plan
        made = worker.bench_metadata.ECCPUConnectorMetadata
        return cache, made(saves=saves), made(loads=loads)

    def step(self, worker: Any, plan: Any) -> object:
        """``execute_model``'s connector calls for one step; the loads' destinations."""
        cache, saves, loads = plan
        loaded: dict[str, torch.Tensor] = {}
        worker.start_load_caches(loaded, loads)
        for name in cache:
            worker.save_caches(cache, name, saves)
        worker.flush_saves()
        worker.build_connector_worker_meta()
        return loaded

    def finish(self, worker: Any) -> None:
        """Report what finished, then shut down."""
        worker.build_connector_worker_meta()
        worker.shutdown()


@typing.final
class KvStepCase(_HostStepCase):
    """vLLM's KV-offload handlers, its lists against ``install(kv_offload=True)``."""

    def __init__(self, steps: int) -> None:
        super().__init__(
            "host-kv",
            f"vLLM's KV-offload handlers: a store or load of 1-{_KV_LARGEST} blocks over "
            f"{len(_KV_PAGES)} tensors, then get_finished, 1-3 in flight; lists vs install()",
            steps,
            kv=True,
        )

    def load(self, name: str) -> dict[str, types.ModuleType]:
        """The worker module, with its copy's ``common`` (the CPU spec) and ``pointer_utils``.

        ``pointer_utils`` is vLLM 0.34's: a transfer takes the device pointers it resolves.
        """
        importlib.import_module("vllm.v1.kv_offload.cpu.common")
        if hasattr(importlib.import_module("vllm.v1.kv_offload.base"), "DevicePointers"):
            importlib.import_module("vllm.v1.kv_offload.pointer_utils")
        return super().load(name)

    def make(self, modules: dict[str, types.ModuleType]) -> Any:
        """A CPUOffloadingWorker over four device tensors, one group, its job id and specs.

        The device side of a transfer is a ``GPULoadStoreSpec`` up to vLLM 0.33; from 0.34,
        the ``DevicePointers`` resolved from it over the worker's caches.
        """
        base = modules["vllm.v1.kv_offload.base"]
        common = modules["vllm.v1.kv_offload.cpu.common"]
        tensors = [
            base.CanonicalKVCacheTensor(
                tensor=host.device_tensor(_KV_BLOCKS, page), page_size_bytes=page
            )
            for page in _KV_PAGES
        ]
        refs = [
            [
                base.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=p)
                for i, p in enumerate(_KV_PAGES)
            ]
        ]
        caches = base.CanonicalKVCaches(tensors=tensors, group_data_refs=refs)
        worker = modules[host.KV_WORKER].CPUOffloadingWorker(
            kv_caches=caches, blocks_per_chunk=1, num_cpu_chunks=_KV_BLOCKS
        )
        device: Callable[..., Any] = base.GPULoadStoreSpec
        pointers = modules.get("vllm.v1.kv_offload.pointer_utils")
        if pointers is not None:
            device = functools.partial(_resolved, pointers.resolve_device_pointers, device, caches)
        return [worker, 0, device, common.CPULoadStoreSpec]

    def plan(self, rng: random.Random) -> Any:
        """A store or a load of log-uniform 1-512 blocks; copies left in flight after it."""
        count = min(_KV_LARGEST, int(math.exp(rng.uniform(0, math.log(_KV_LARGEST + 1)))))
        blocks = rng.sample(range(_KV_BLOCKS), count)
        chunks = rng.sample(range(_KV_BLOCKS), count)
        return rng.random() < 0.5, blocks, chunks, rng.randint(1, 3)

    def prepare(self, worker: Any, plan: Any) -> Any:
        """The transfer's specs, of *worker*'s own classes.

        Device pointers are resolved here, untimed: vLLM's connector does it before it submits.
        """
        store, blocks, chunks, in_flight = plan
        gpu = worker[2](blocks, group_sizes=(len(blocks),), block_indices=(0,))
        return store, gpu, worker[3](chunks), in_flight

    def step(self, worker: Any, plan: Any) -> object:
        """Submit the transfer, run copies until the plan's are in flight, ``get_finished()``."""
        store, gpu, cpu, in_flight = plan
        offloading, job = worker[0], worker[1]
        worker[1] = job + 1
        if store:
            offloading.submit_store(job, gpu, cpu)
        else:
            offloading.submit_load(job, cpu, gpu)
        device = host.device()
        device.run_to(device.submitted - in_flight)
        offloading.get_finished()
        return None  # the worker's own tensors

    def finish(self, worker: Any) -> None:
        """Report what finished, then shut down."""
        worker[0].get_finished()
        worker[0].shutdown()

    def _unrecord(self, worker: Any) -> None:
        """Give the handlers the op as vLLM's: each took the wrapped one when it was made."""
        for handler in vars(worker[0]).values():
            op = getattr(handler, "_swap_blocks_batch", None)
            if _recording(op):
                handler._swap_blocks_batch = op.__wrapped__  # type: ignore[union-attr]


def _recording(value: object) -> bool:
    """Whether *value* is an op `bucketpool._copies.recording` wrapped (it has its code)."""
    code = getattr(value, "__code__", None)
    return code is not None and code.co_filename == _copies.__file__


def _resolved(
    resolve: Callable[..., Any], spec: Callable[..., Any], caches: Any, *args: Any, **kwargs: Any
) -> Any:
    """The device pointers *resolve* finds over *caches* for the ``spec(*args, **kwargs)``."""
    return resolve(spec(*args, **kwargs), caches)


def host_step_cases(steps: int) -> list[EcStepCase | KvStepCase]:
    """The host-step cases, *steps* interleaved steps a round; none without a vLLM wheel."""
    if host.vllm_locations() is None:
        return []
    return [EcStepCase("small", steps), EcStepCase("large", steps), KvStepCase(steps)]
