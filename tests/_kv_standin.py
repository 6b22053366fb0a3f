"""The host stand-in (`_vllm_standin`) widened to vLLM's KV-offload worker, ``gpu_worker``.

The real modules loaded are ``gpu_worker``, ``base``, ``config``, ``common`` and vLLM's
``math_utils``; what they import from elsewhere is stubbed: no Triton (so copies go to
``vllm._custom_ops.swap_blocks_batch``, queued on the `HostDevice`), no host registration,
no pinning, and a ``SharedOffloadRegion`` that cannot be made.  The handler asserts that its
device tensors are on CUDA or XPU: `device_tensor` makes a host tensor that says it is on
CUDA (a `FakeDeviceTensor`), so the copies read and write host memory.
"""

from __future__ import annotations

import random
import sys
import types

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


class _SharedOffloadRegion:
    """Stand-in: the tests that need a shared region fail or skip alike, with or without."""

    BLOCK_SIZE_ALIGNMENT = 4096

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("no SharedOffloadRegion on the host stand-in")


def _set_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def install_kv_standin(
    monkeypatch: pytest.MonkeyPatch, *, eager: bool, xpu: bool = False
) -> standin.HostDevice:
    """Put the EC stand-in and the KV worker's stubs in place for one test; return the device.

    Raises:
        pytest.skip.Exception: no ``vllm`` package can be found.
    """
    host = standin.install_standin(monkeypatch, eager=eager, xpu=xpu)
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
        "vllm.v1.kv_offload.cpu.shared_offload_region": {
            "SharedOffloadRegion": _SharedOffloadRegion
        },
        "vllm.v1.kv_offload.cpu.swap_blocks_triton": {
            "THRESHOLD_BYTES": 1 << 20,
            "swap_blocks_batch": standin.swap_blocks_batch,
        },
    }
    for name in _BARE_PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = ["/".join([place, *name.split(".")[1:]]) for place in locations]
        monkeypatch.setitem(sys.modules, name, package)
    for name, attributes in stubs.items():
        module = types.ModuleType(name)
        vars(module).update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    return host
