"""The host stand-in for vLLM's workers (`bench._vllm_host`), for tests: skipped without vLLM.

Used by the tests against vLLM, once for each vLLM found (`vllm_sites`: the newest's wheel
in ``.vllm/site``, an older one's modules in ``.vllm/VERSION/site``, or the directories
``$BUCKETPOOL_VLLM_SITE`` names, or an importable one).  Each test puts the stand-in in
place through its ``monkeypatch``, which undoes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
    vllm_sites,
    vllm_version,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tests run on 3.11 and later
    tomllib = pytest.importorskip("tomli")

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
    "distribution",
    "install_kv_standin",
    "install_standin",
    "site_params",
    "swap_blocks_batch",
    "test_file",
    "vllm_locations",
    "vllm_sites",
    "vllm_version",
]

_NONE = "no vLLM: run .ci/setup (see docs/development.md)"
_ROOT = Path(__file__).resolve().parent.parent


def distribution(directory: Path) -> Path:
    """Write into *directory* bucketpool's ``.dist-info``, entry points from pyproject.toml.

    vLLM's plugin loader finds bucketpool's entry point there (the shared ``.venv`` may hold
    a ``.dist-info`` installed before the entry point was declared).
    """
    project = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    info = directory / f"bucketpool-{project['version']}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: bucketpool\nVersion: {project['version']}\n"
    (info / "METADATA").write_text(metadata, encoding="utf-8")
    groups = [
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
        for group, points in project["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(groups), encoding="utf-8")
    return directory


def site_params() -> list[object]:
    """One ``pytest.param`` per vLLM to test (`vllm_sites`), named ``vllm-VERSION``.

    Without any, one that skips.
    """
    sites = vllm_sites()
    if not sites:
        return [pytest.param(None, id="no-vllm", marks=pytest.mark.skip(reason=_NONE))]
    return [pytest.param(site, id=f"vllm-{vllm_version(site)}") for site in sites]


def test_file(site: Path, name: str) -> Path:
    """vLLM's own test file *name* beside *site* (``.ci/setup`` puts it there).

    Skipped without it, unless ``$BUCKETPOOL_VLLM_SITE`` names the sites (CI): then an error.
    """
    path = site.parent / "tests" / name
    if not path.is_file():
        if SITE_VARIABLE not in os.environ:
            pytest.skip(f"no vLLM test files beside {site}: run .ci/setup")
        raise FileNotFoundError(f"{SITE_VARIABLE}: no {path}; run .ci/setup")
    return path


def _locations(site: Path | None) -> list[str]:
    locations = vllm_locations(site)
    if locations is None:
        pytest.skip(_NONE)
    return locations


def install_standin(
    monkeypatch: pytest.MonkeyPatch,
    *,
    eager: bool,
    cuda: bool = False,
    xpu: bool = False,
    site: Path | None = None,
) -> HostDevice:
    """`bench._vllm_host.install_standin` for one test, over the vLLM in *site* (the newest
    by default); skipped without vLLM."""
    return _vllm_host.install_standin(
        monkeypatch, _locations(site), eager=eager, cuda=cuda, xpu=xpu
    )


def install_kv_standin(
    monkeypatch: pytest.MonkeyPatch,
    *,
    eager: bool,
    cuda: bool = False,
    xpu: bool = False,
    device_tensors: bool = False,
    site: Path | None = None,
) -> HostDevice:
    """`bench._vllm_host.install_kv_standin` for one test, over the vLLM in *site* (the
    newest by default); skipped without vLLM."""
    return _vllm_host.install_kv_standin(
        monkeypatch,
        _locations(site),
        eager=eager,
        cuda=cuda,
        xpu=xpu,
        device_tensors=device_tensors,
    )
