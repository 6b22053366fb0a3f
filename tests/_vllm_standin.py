"""The host stand-in for vLLM's workers (`bench._vllm_host`), for tests: skipped without vLLM.

Used by the tests against vLLM when a wheel can be found (installed with ``--no-deps`` into
``.vllm/site`` or ``$BUCKETPOOL_VLLM_SITE``, or importable; see `vllm_locations`).  Each
test puts the stand-in in place through its ``monkeypatch``, which undoes it.
"""

from __future__ import annotations

import pytest

from bench import _vllm_host
from bench._vllm_host import (
    DEFAULT_SITE,
    KV_WORKER,
    SITE_VARIABLE,
    WORKER,
    HostDevice,
    HostEvent,
    HostPlatform,
    HostStream,
    device,
    device_tensor,
    swap_blocks_batch,
    vllm_locations,
)

__all__ = [
    "DEFAULT_SITE",
    "KV_WORKER",
    "SITE_VARIABLE",
    "WORKER",
    "HostDevice",
    "HostEvent",
    "HostPlatform",
    "HostStream",
    "device",
    "device_tensor",
    "install_kv_standin",
    "install_standin",
    "swap_blocks_batch",
    "vllm_locations",
]


def _locations() -> list[str]:
    locations = vllm_locations()
    if locations is None:
        pytest.skip("no vLLM: run .ci/setup (see docs/development.md)")
    return locations


def install_standin(
    monkeypatch: pytest.MonkeyPatch, *, eager: bool, cuda: bool = False, xpu: bool = False
) -> HostDevice:
    """`bench._vllm_host.install_standin` for one test; skipped without vLLM."""
    return _vllm_host.install_standin(monkeypatch, _locations(), eager=eager, cuda=cuda, xpu=xpu)


def install_kv_standin(
    monkeypatch: pytest.MonkeyPatch,
    *,
    eager: bool,
    cuda: bool = False,
    xpu: bool = False,
    device_tensors: bool = False,
) -> HostDevice:
    """`bench._vllm_host.install_kv_standin` for one test; skipped without vLLM."""
    return _vllm_host.install_kv_standin(
        monkeypatch, _locations(), eager=eager, cuda=cuda, xpu=xpu, device_tensors=device_tensors
    )
