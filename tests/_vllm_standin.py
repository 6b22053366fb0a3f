"""A host stand-in for what vLLM's EC CPU worker needs, to run the real worker without a GPU.

Used by ``test_vllm_real.py`` when a vLLM wheel can be found (installed with ``--no-deps``
into ``.vllm/site`` or ``$BUCKETPOOL_VLLM_SITE``, or importable; see `vllm_locations`).
vLLM's own ``__init__`` files pull in most of its dependencies, so the packages on the way
to the EC CPU connector are registered here as bare packages over the real directories
(their ``__init__`` never runs), and the few modules the worker imports from elsewhere are
small stand-ins:

- ``vllm._custom_ops.swap_blocks_batch`` queues a `bucketpool.testing.swap_blocks_batch`
  call on the `HostDevice`;
- ``vllm.platforms.current_platform`` is a `HostPlatform` whose streams are `HostStream`;
- ``torch.Event`` becomes `HostEvent` (events complete when the device has run every copy
  queued before them), and ``Tensor.record_stream`` does nothing on CPU tensors;
- the logger, the parallel state and ``is_pin_memory_available`` are trivial.

The real modules loaded are ``descriptor_buffers``, the worker, ``common`` and
``ec_shared_region`` (a real ``/dev/shm`` mmap).

The `HostDevice` runs copies in submission order, either at once (``eager``) or when told
(`HostDevice.advance`, `HostDevice.drain`, an event's ``synchronize``), so that copies can be
left in flight: a copy reads its descriptors when it runs, as the GPU does, so descriptor
buffers reused too early change what it copies.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bucketpool import testing

__all__ = [
    "DEFAULT_SITE",
    "SITE_VARIABLE",
    "HostDevice",
    "HostEvent",
    "HostPlatform",
    "HostStream",
    "install_standin",
    "vllm_locations",
]

WORKER = "vllm.distributed.ec_transfer.ec_connector.cpu.worker"

#: The environment variable naming a directory that holds the ``vllm`` package to test.
SITE_VARIABLE = "BUCKETPOOL_VLLM_SITE"
#: Where ``.ci/setup`` installs vLLM's wheel; where the tests look when the variable is unset.
DEFAULT_SITE = Path(__file__).resolve().parent.parent / ".vllm" / "site"

# Packages registered bare over the real directories: their __init__ imports half of vLLM.
_BARE_PACKAGES = (
    "vllm",
    "vllm.distributed",
    "vllm.distributed.ec_transfer",
    "vllm.distributed.ec_transfer.ec_connector",
    "vllm.utils",
)

_device: HostDevice | None = None


def vllm_locations() -> list[str] | None:
    """Return the directories of the ``vllm`` package to test against, or None without one.

    The package is looked for in the directory ``$BUCKETPOOL_VLLM_SITE`` names, by default
    `DEFAULT_SITE` (a ``pip install --no-deps --target`` directory), and then on
    ``sys.path``.  That directory is not put on ``sys.path``: only the stand-in's bare
    packages reach it, so the rest of the suite sees no vLLM.  Finding the package runs
    none of its code, so a wheel installed without its dependencies is found too.

    Raises:
        RuntimeError: ``$BUCKETPOOL_VLLM_SITE`` is set but holds no ``vllm`` package (a set
            variable means the tests must run, so they fail rather than skip).
    """
    named = os.environ.get(SITE_VARIABLE, "")
    spec = importlib.machinery.PathFinder.find_spec("vllm", [named or str(DEFAULT_SITE)])
    if spec is None or not spec.submodule_search_locations:
        if named:
            raise RuntimeError(f"{SITE_VARIABLE}={named!r} holds no vllm package")
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return None
    return list(spec.submodule_search_locations)


def device() -> HostDevice:
    """Return the stand-in device of the running test."""
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


class HostEvent:
    """``torch.Event`` on the stand-in: done once every copy queued before it has run."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self._position: int | None = None

    def record(self, stream: object = None) -> None:
        self._position = device().submitted

    def query(self) -> bool:
        return self._position is None or device().done >= self._position

    def synchronize(self) -> None:
        if self._position is not None:
            device().run_to(self._position)

    def wait(self, stream: object = None) -> None:
        pass

    def elapsed_time(self, end_event: HostEvent) -> float:
        return 0.0


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
        cuda: what ``is_cuda()`` answers (vLLM's byte tests run only where it is true).
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
        return False  # vLLM's stall tests need torch.cuda._sleep

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
    """``vllm._custom_ops.swap_blocks_batch`` on the stand-in: queue the host copy."""
    device().submit(lambda: testing.swap_blocks_batch(src_ptrs, dst_ptrs, sizes))


class _ConnectorMetadata:
    """Stand-in base of vLLM's connector metadata dataclasses."""


def _record_stream(self: torch.Tensor, stream: object) -> None:
    """``Tensor.record_stream`` on the stand-in: host tensors need no stream bookkeeping."""


def _module(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def _stubs(locations: list[str], platform: HostPlatform) -> list[types.ModuleType]:
    packages = []
    for name in _BARE_PACKAGES:
        package = _module(name)
        relative = name.split(".")[1:]
        package.__path__ = [  # a package over the real directory; its __init__ never runs
            "/".join([location, *relative]) for location in locations
        ]
        packages.append(package)
    return [
        *packages,
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
    monkeypatch: pytest.MonkeyPatch, *, eager: bool, cuda: bool = False, xpu: bool = False
) -> HostDevice:
    """Put the stand-in in place for one test and return its device.

    Every ``vllm`` module already imported is hidden and every stand-in registered through
    *monkeypatch*; modules imported during the test are not, so the caller removes them
    (see ``test_vllm_real.py``'s fixture).  *eager* runs every copy as it is queued;
    *cuda* and *xpu* are what the platform answers to ``is_cuda()`` and ``is_xpu()``.

    Raises:
        pytest.skip.Exception: no ``vllm`` package can be found.
    """
    locations = vllm_locations()
    if locations is None:
        pytest.skip("no vLLM: run .ci/setup (see docs/development.md)")
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    platform = HostPlatform(cuda=cuda, xpu=xpu)
    for module in _stubs(locations, platform):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(torch, "Event", HostEvent)
    monkeypatch.setattr(torch.Tensor, "record_stream", _record_stream)
    host = HostDevice(eager=eager)
    monkeypatch.setattr(sys.modules[__name__], "_device", host)
    return host
