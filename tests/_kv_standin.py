"""The host stand-in (`_vllm_standin`) widened to vLLM's KV-offload worker, ``gpu_worker``.

The real modules loaded are ``gpu_worker``, ``base``, ``config``, ``common``,
``shared_offload_region`` and vLLM's ``math_utils``; what they import from elsewhere is
stubbed: no Triton (so copies go to ``vllm._custom_ops.swap_blocks_batch``, queued on the
`HostDevice`), no host registration, no pinning, no check of ``/dev/shm``'s free space.
The handler asserts that its device tensors are on CUDA or XPU: `device_tensor` makes a
host tensor that says it is on CUDA (a `FakeDeviceTensor`), so copies move host memory.
"""

from __future__ import annotations

import importlib
import random
import sys
import types
from typing import Any

import _vllm_standin as standin
import numpy as np
import pytest
import torch

__all__ = ["KV_WORKER", "FakeDeviceTensor", "device_tensor", "install_kv_standin"]

KV_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"

_BARE_PACKAGES = ("vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu", "vllm.v1.metrics")


class FakeDeviceTensor(torch.Tensor):
    """A host tensor that answers ``is_cuda`` with True (vLLM's handler asserts it)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def device_tensor(blocks: int, page_bytes: int) -> torch.Tensor:
    """A zeroed ``(blocks, page_bytes)`` int8 `FakeDeviceTensor` in host memory."""
    host = torch.zeros((blocks, page_bytes), dtype=torch.int8, device="cpu")
    return host.as_subclass(FakeDeviceTensor)


class _TimedEvent(standin.HostEvent):
    """A `HostEvent` whose copies take a microsecond (vLLM's tests want a positive time)."""

    def elapsed_time(self, end_event: standin.HostEvent) -> float:
        return 1e-3


def _set_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def install_kv_standin(
    monkeypatch: pytest.MonkeyPatch,
    *,
    eager: bool,
    cuda: bool = False,
    xpu: bool = False,
    device_tensors: bool = False,
) -> standin.HostDevice:
    """Put the EC stand-in and the KV worker's stubs in place for one test; return the device.

    With *device_tensors*, every ``CanonicalKVCacheTensor`` made holds a `FakeDeviceTensor`
    (for vLLM's own tests, which make their "device" tensors on ``cpu:0`` here); *eager*,
    *cuda* and *xpu* go to `_vllm_standin.install_standin`.

    Raises:
        pytest.skip.Exception: no ``vllm`` package can be found.
    """
    host = standin.install_standin(monkeypatch, eager=eager, cuda=cuda, xpu=xpu)
    locations = standin.vllm_locations()
    assert locations is not None
    stubs: dict[str, dict[str, object]] = {
        "vllm.triton_utils": {"HAS_TRITON": False, "triton": None, "tl": None},
        "vllm.utils.torch_utils": {"PIN_MEMORY": False, "set_random_seed": _set_random_seed},
        "vllm.v1.kv_hints": {"KvHintsEnvelope": object},
        "vllm.v1.kv_offload.cpu.host_register": {
            "host_register": lambda address, size: False,
            "host_unregister": lambda address: None,
        },
        "vllm.distributed.device_communicators": {},
        "vllm.distributed.device_communicators.shm_broadcast": {
            "check_shm_free_space": lambda *args, **kwargs: None
        },
        "vllm.v1.kv_offload.cpu.swap_blocks_triton": {
            "THRESHOLD_BYTES": 1 << 20,
            "swap_blocks_batch": standin.swap_blocks_batch,
        },
    }
    monkeypatch.setattr(torch, "Event", _TimedEvent)
    for name in _BARE_PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = ["/".join([place, *name.split(".")[1:]]) for place in locations]
        monkeypatch.setitem(sys.modules, name, package)
    for name, attributes in stubs.items():
        module = types.ModuleType(name)
        vars(module).update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    if device_tensors:  # what the caller puts in a CanonicalKVCacheTensor is on the "device"
        tensor_class = importlib.import_module("vllm.v1.kv_offload.base").CanonicalKVCacheTensor
        made = tensor_class.__init__

        def __init__(self: Any, tensor: torch.Tensor, page_size_bytes: int) -> None:
            made(self, tensor.as_subclass(FakeDeviceTensor), page_size_bytes)

        monkeypatch.setattr(tensor_class, "__init__", __init__)
    return host
