"""vLLM's real workers on the host: the stand-in for the accelerator they need, no GPU.

The benchmark's host-step cases (`bench._host_step`) and the tests against vLLM
(``tests/_vllm_standin.py``) load vLLM's real EC CPU worker and KV-offload worker from a
wheel installed without its dependencies (``.ci/setup`` puts the newest in ``.vllm/site``,
and the modules of an older one in ``.vllm/VERSION/site``; see `vllm_sites`).  vLLM's own
``__init__`` files pull in most of its dependencies, so the packages on the way are
registered as bare packages over the real directories (their ``__init__`` never runs;
``vllm`` gets the ``__version__`` its ``__init__`` would set), and
the few modules the workers import from elsewhere are small stand-ins:

- ``vllm._custom_ops.swap_blocks_batch`` queues a `bucketpool.testing.swap_blocks_batch`
  call on the `HostDevice`;
- ``vllm.platforms.current_platform`` is a `HostPlatform` whose streams are `HostStream`;
- ``torch.Event`` becomes `HostEvent` (done once the device has run every copy queued
  before it), and ``Tensor.record_stream`` does nothing on CPU tensors;
- the logger, the parallel state, pinning, Triton and host registration are trivial.

The `HostDevice` runs copies in submission order, at once (``eager``) or when told
(`HostDevice.advance`, `HostDevice.drain`, an event's ``synchronize``): a copy reads its
descriptors when it runs, as a GPU does, so descriptor buffers reused too early change
what it copies.  Every patch goes through a `Patches` (pytest's ``MonkeyPatch``), which
undoes them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import random
import runpy
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bucketpool import testing

__all__ = [
    "DEFAULT_SITE",
    "KV_WORKER",
    "SITE_VARIABLE",
    "WORKER",
    "FakeDeviceTensor",
    "HostDevice",
    "HostEvent",
    "HostPlatform",
    "HostStream",
    "Patches",
    "device",
    "device_tensor",
    "install_kv_standin",
    "install_standin",
    "swap_blocks_batch",
    "use_device",
    "vllm_locations",
    "vllm_sites",
    "vllm_version",
]

WORKER = "vllm.distributed.ec_transfer.ec_connector.cpu.worker"
KV_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"
#: The environment variable naming the directories that hold the ``vllm`` packages to use.
SITE_VARIABLE = "BUCKETPOOL_VLLM_SITE"
#: Where ``.ci/setup`` installs the newest vLLM's wheel; the first place to look when the
#: variable is unset.  Older vLLMs' modules go to ``.vllm/VERSION/site`` (`vllm_sites`).
DEFAULT_SITE = Path(__file__).resolve().parent.parent / ".vllm" / "site"

# Packages registered bare over the real directories: their __init__ imports half of vLLM.
_BARE_PACKAGES = (
    "vllm",
    "vllm.distributed",
    "vllm.distributed.ec_transfer",
    "vllm.distributed.ec_transfer.ec_connector",
    "vllm.utils",
)
_KV_BARE_PACKAGES = ("vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu", "vllm.v1.metrics")

_device: HostDevice | None = None


class Patches(Protocol):
    """What the stand-in patches through: pytest's ``MonkeyPatch`` (which undoes it all)."""

    def setattr(self, target: object, name: str, value: object) -> None: ...
    def setitem(self, mapping: Any, name: str, value: object) -> None: ...
    def delitem(self, mapping: Any, name: str) -> None: ...


def vllm_sites() -> list[Path]:
    """Return the directories holding the ``vllm`` packages to use, the newest first.

    ``$BUCKETPOOL_VLLM_SITE`` names them, separated by `os.pathsep`.  Unset: `DEFAULT_SITE`
    (a ``pip install --no-deps --target`` directory) and each ``.vllm/VERSION/site`` beside
    it that holds a ``vllm`` package (``.ci/setup`` puts there the modules of an older vLLM
    that the stand-in loads, from its sdist), newest first; without any, the directory of
    an importable ``vllm``.  No directory is put on ``sys.path``: only the stand-in's bare
    packages reach into it, so the rest of the process sees no vLLM.  Finding a package
    runs none of its code, so a wheel installed without its dependencies is found too.

    Raises:
        RuntimeError: a directory ``$BUCKETPOOL_VLLM_SITE`` names holds no ``vllm`` package
            (a set variable means the tests must run, so they fail rather than skip).
    """
    named = os.environ.get(SITE_VARIABLE, "")
    if named:
        sites = [Path(each) for each in named.split(os.pathsep) if each]
        for site in sites:
            if _package(site) is None:
                raise RuntimeError(f"{SITE_VARIABLE}={named!r}: {site} holds no vllm package")
        return sites
    older = sorted(DEFAULT_SITE.parent.glob("*/site"), key=_release, reverse=True)
    found = [site for site in (DEFAULT_SITE, *older) if _package(site) is not None]
    if found:
        return found
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(next(iter(spec.submodule_search_locations))).parent]


def vllm_locations(site: Path | None = None) -> list[str] | None:
    """Return the directories of the ``vllm`` package in *site*, or None without one.

    *site* defaults to the first of `vllm_sites` (the newest vLLM).

    Raises:
        RuntimeError: as `vllm_sites`.
    """
    if site is None:
        sites = vllm_sites()
        if not sites:
            return None
        site = sites[0]
    return _package(site)


def vllm_version(site: Path) -> str:
    """The version of the vLLM in *site*: its wheel's ``dist-info``, else the directory's.

    ``.ci/setup``'s older vLLMs are in ``.vllm/VERSION/site``, with no ``dist-info``.
    """
    for info in site.glob("vllm-*.dist-info"):
        return info.name.removeprefix("vllm-").removesuffix(".dist-info")
    return site.parent.name if site.name == "site" else site.name


def _package(site: Path) -> list[str] | None:
    spec = importlib.machinery.PathFinder.find_spec("vllm", [str(site)])
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)


def _release(site: Path) -> tuple[int, ...]:
    """``.vllm/0.33.0/site``'s release, (0, 33, 0), for sorting (a stray name sorts last)."""
    parts = site.parent.name.split(".")
    return tuple(int(part) for part in parts) if all(p.isdigit() for p in parts) else ()


def device() -> HostDevice:
    """Return the stand-in device in place."""
    if _device is None:
        raise RuntimeError("no HostDevice: call install_standin() first")
    return _device


class HostDevice:
    """One in-order queue of copies, run at once (*eager*) or when told."""

    def __init__(self, *, eager: bool) -> None:
        self.eager = eager
        self._queue: list[Callable[[], None] | None] = []
        self._done = 0

    @property
    def submitted(self) -> int:
        """How many copies were queued so far."""
        return len(self._queue)

    @property
    def done(self) -> int:
        """How many of them have run."""
        return self._done

    def submit(self, work: Callable[[], None]) -> None:
        """Queue *work*; run it now if eager."""
        self._queue.append(work)
        if self.eager:
            self.drain()

    def run_to(self, position: int) -> None:
        """Run the queued copies up to *position* (exclusive), in order."""
        while self._done < min(position, len(self._queue)):
            work = self._queue[self._done]
            self._queue[self._done] = None  # let go of the tensors it holds
            self._done += 1
            if work is not None:
                work()

    def advance(self, count: int) -> None:
        """Run the next *count* queued copies (fewer if fewer are queued)."""
        self.run_to(self._done + count)

    def drain(self) -> None:
        """Run every queued copy."""
        self.run_to(len(self._queue))


def use_device(host: HostDevice) -> None:
    """Make *host* the device in place: copies and events from now on are its."""
    global _device
    _device = host


class HostEvent:
    """``torch.Event`` on the stand-in: done once every copy queued before it has run.

    It belongs to the device in place when it was last recorded.
    """

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self._device: HostDevice | None = None
        self._position = 0

    def record(self, stream: object = None) -> None:
        self._device = device()
        self._position = self._device.submitted

    def query(self) -> bool:
        return self._device is None or self._device.done >= self._position

    def synchronize(self) -> None:
        if self._device is not None:
            self._device.run_to(self._position)

    def wait(self, stream: object = None) -> None:
        pass

    def elapsed_time(self, end_event: HostEvent) -> float:
        return 1e-3  # a microsecond: vLLM's KV tests want a positive time


class HostStream:
    """A stream of the stand-in: all streams share the device's one queue."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def synchronize(self) -> None:
        device().drain()


class HostPlatform:
    """``vllm.platforms.current_platform`` for a host that plays the accelerator.

    Args:
        cuda: what ``is_cuda()`` and ``is_cuda_alike()`` answer (vLLM's byte tests run only
            where one is true; its stall tests, which need ``torch.cuda._sleep``, are skipped
            by ``tests/vllm_plugin.py``).
        xpu: what ``is_xpu()`` answers (vLLM's pool then makes uint64 descriptors).
    """

    device_type = "cpu"
    Stream = HostStream

    def __init__(self, *, cuda: bool = False, xpu: bool = False) -> None:
        self._cuda = cuda
        self._xpu = xpu
        self._current = HostStream()

    def is_cuda(self) -> bool:
        return self._cuda

    def is_cuda_alike(self) -> bool:
        return self._cuda

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return self._xpu

    def current_stream(self) -> HostStream:
        return self._current

    @contextlib.contextmanager
    def stream(self, stream: HostStream) -> Iterator[None]:
        yield


def swap_blocks_batch(
    src_ptrs: torch.Tensor,
    dst_ptrs: torch.Tensor,
    sizes: torch.Tensor,
    is_src_access_order_any: bool = False,
) -> None:
    """``vllm._custom_ops.swap_blocks_batch`` on the stand-in: queue the host copy.

    The copy reads the memory when it runs, whatever became of the views (as a device does).
    """
    src, dst, size = (tensor.as_subclass(torch.Tensor) for tensor in (src_ptrs, dst_ptrs, sizes))
    device().submit(lambda: testing.swap_blocks_batch(src, dst, size))


def _triton_swap_blocks_batch(
    src_addrs: torch.Tensor,
    dst_addrs: torch.Tensor,
    sizes: torch.Tensor,
    is_src_access_order_any: bool = False,
    *,
    bytes_per_chunk: int = 0,
) -> None:
    """The KV offload's Triton ``swap_blocks_batch`` on the stand-in: the same host copy.

    A function of its own, as vLLM's is, so that what wraps one op and not the other shows.
    """
    swap_blocks_batch(src_addrs, dst_addrs, sizes, is_src_access_order_any)


class _ConnectorMetadata:
    """Stand-in base of vLLM's connector metadata dataclasses."""


def _record_stream(self: torch.Tensor, stream: object) -> None:
    """``Tensor.record_stream`` on the stand-in: host tensors need no stream bookkeeping."""


def _module(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    vars(module).update(attributes)
    return module


def _bare(name: str, locations: list[str]) -> types.ModuleType:
    """A package over the real directory of *name*; its ``__init__`` never runs."""
    package = _module(name)
    package.__path__ = ["/".join([place, *name.split(".")[1:]]) for place in locations]
    if name == "vllm":
        package.__version__ = _version(locations)  # type: ignore[attr-defined]
    return package


def _version(locations: list[str]) -> str:
    """The version ``vllm/__init__`` sets: the wheel's, else its sdist's, else "dev".

    Modules from an sdist (``.ci/vllm_sdist.py``) carry its name in a ``SDIST`` stamp.
    """
    for place in locations:
        path = Path(place, "_version.py")  # generated when the wheel was built
        if path.is_file():
            return str(runpy.run_path(str(path))["__version__"])
        stamp = Path(place, "SDIST")  # vllm-VERSION.tar.gz
        if stamp.is_file():
            return stamp.read_text().strip().removeprefix("vllm-").removesuffix(".tar.gz")
    return "dev"


def _stubs(locations: list[str], platform: HostPlatform) -> list[types.ModuleType]:
    return [
        *(_bare(name, locations) for name in _BARE_PACKAGES),
        _module("vllm._custom_ops", swap_blocks_batch=swap_blocks_batch),
        _module("vllm.platforms", current_platform=platform),
        _module("vllm.logger", init_logger=logging.getLogger),
        _module(
            "vllm.distributed.parallel_state",
            get_tensor_model_parallel_rank=lambda: 0,
            get_pcp_group=lambda: types.SimpleNamespace(rank_in_group=0),
        ),
        _module("vllm.utils.platform_utils", is_pin_memory_available=lambda: False),
        _module(
            "vllm.distributed.ec_transfer.ec_connector.base",
            ECConnectorMetadata=_ConnectorMetadata,
            ECConnectorWorkerMetadata=_ConnectorMetadata,
        ),
    ]


def install_standin(
    patches: Patches, locations: list[str], *, eager: bool, cuda: bool = False, xpu: bool = False
) -> HostDevice:
    """Put the EC stand-in in place over vLLM's *locations*; return its device.

    Every ``vllm`` module already imported is hidden and every stand-in registered through
    *patches*; modules imported afterwards are not, so the caller removes them.  *eager*
    runs every copy as it is queued; *cuda* and *xpu* are what the platform answers to
    ``is_cuda()`` and ``is_xpu()``.
    """
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        patches.delitem(sys.modules, name)
    platform = HostPlatform(cuda=cuda, xpu=xpu)
    for module in _stubs(locations, platform):
        patches.setitem(sys.modules, module.__name__, module)
    patches.setattr(torch, "Event", HostEvent)
    patches.setattr(torch.Tensor, "record_stream", _record_stream)
    host = HostDevice(eager=eager)
    patches.setattr(sys.modules[__name__], "_device", host)
    return host


class FakeDeviceTensor(torch.Tensor):
    """A host tensor that answers ``is_cuda`` with True (vLLM's KV handler asserts it)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def device_tensor(blocks: int, page_bytes: int) -> torch.Tensor:
    """A zeroed ``(blocks, page_bytes)`` int8 `FakeDeviceTensor` in host memory."""
    host = torch.zeros((blocks, page_bytes), dtype=torch.int8, device="cpu")
    return host.as_subclass(FakeDeviceTensor)


class _CudaRTLibrary:
    """vLLM 0.34's ``CudaRTLibrary``: a failed copy leaves no device error to clear here."""

    def cudaGetLastError(self) -> int:
        return 0


def _set_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def install_kv_standin(
    patches: Patches,
    locations: list[str],
    *,
    eager: bool,
    cuda: bool = False,
    xpu: bool = False,
    device_tensors: bool = False,
) -> HostDevice:
    """Put the EC stand-in and the KV-offload worker's stubs in place; return the device.

    The real modules then loaded are ``gpu_worker``, ``base``, ``config``, ``common``,
    ``shared_offload_region``, vLLM's ``math_utils`` and (from vLLM 0.34) ``pointer_utils``;
    no Triton (copies go to ``vllm._custom_ops.swap_blocks_batch``), no host registration,
    no pinning, no check of ``/dev/shm``, no device error to clear after a failed copy.
    With *device_tensors*, every ``CanonicalKVCacheTensor`` made holds a `FakeDeviceTensor`
    (vLLM's own tests make their "device" tensors on ``cpu:0`` here).
    """
    host = install_standin(patches, locations, eager=eager, cuda=cuda, xpu=xpu)
    stubs: dict[str, dict[str, object]] = {
        "vllm.triton_utils": {"HAS_TRITON": False, "triton": None, "tl": None},
        "vllm.utils.torch_utils": {"PIN_MEMORY": False, "set_random_seed": _set_random_seed},
        "vllm.v1.kv_hints": {"KvHintsEnvelope": object},
        "vllm.v1.kv_offload.cpu.host_register": {
            "host_register": lambda address, size: False,
            "host_unregister": lambda address: None,
        },
        "vllm.distributed.device_communicators": {"__path__": []},  # a package
        "vllm.distributed.device_communicators.shm_broadcast": {
            "check_shm_free_space": lambda *args, **kwargs: None
        },
        "vllm.distributed.device_communicators.cuda_wrapper": {"CudaRTLibrary": _CudaRTLibrary},
        "vllm.v1.kv_offload.cpu.swap_blocks_triton": {
            "THRESHOLD_BYTES": 1 << 20,
            "swap_blocks_batch": _triton_swap_blocks_batch,
        },
    }
    for name in _KV_BARE_PACKAGES:
        patches.setitem(sys.modules, name, _bare(name, locations))
    for name, attributes in stubs.items():
        patches.setitem(sys.modules, name, _module(name, **attributes))
    if device_tensors:  # what the caller puts in a CanonicalKVCacheTensor is on the "device"
        tensor_class = importlib.import_module("vllm.v1.kv_offload.base").CanonicalKVCacheTensor
        made = tensor_class.__init__

        def __init__(self: Any, tensor: torch.Tensor, page_size_bytes: int) -> None:
            made(self, tensor.as_subclass(FakeDeviceTensor), page_size_bytes)

        patches.setattr(tensor_class, "__init__", __init__)
    return host
