"""Extract from vLLM's sdist what the tests need: its test files, and (``--modules``) modules.

Usage: python .ci/vllm_sdist.py [--modules] VERSION DESTINATION

- DESTINATION/tests: the test files tests/test_vllm_tests.py runs (`TEST_FILES`);
- with ``--modules``, DESTINATION/site/vllm: the modules the host stand-in of
  bench/_vllm_host.py loads (`MODULES`), for a vLLM whose wheel is not installed.  They are
  the wheel's files byte for byte (checked for 0.33.0 and 0.34.0).

The sdist is found through PyPI's simple API in JSON (``pip download --no-binary`` downloads
it but then fails building its metadata), checked against its pinned SHA-256, and only those
files are extracted: nothing of vLLM is copied into this repository.  Nothing is fetched
when every directory asked for holds this version's files already (its ``SDIST`` stamp).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

#: The sdists this script may fetch, by version.
SHA256 = {
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    "0.34.0": "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
}
INDEX = "https://pypi.org/simple/vllm/"
STAMP = "SDIST"  # in each extracted directory: the sdist it came from
TEST_FILES = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/ec_connector/__init__.py",
    "tests/v1/ec_connector/unit/utils.py",
    "tests/v1/ec_connector/unit/cpu/worker/test_worker.py",
    "tests/v1/kv_offload/__init__.py",
    "tests/v1/kv_offload/conftest.py",
    "tests/v1/kv_offload/cpu/__init__.py",
    "tests/v1/kv_offload/cpu/test_gpu_worker.py",
)
#: What the stand-in and the tests load of a vLLM of 0.33.0's layout (vllm/__init__.py
#: never runs; it makes the directory a package).
MODULES = (
    "vllm/__init__.py",
    "vllm/distributed/ec_transfer/ec_connector/cpu/__init__.py",
    "vllm/distributed/ec_transfer/ec_connector/cpu/common.py",
    "vllm/distributed/ec_transfer/ec_connector/cpu/ec_shared_region.py",
    "vllm/distributed/ec_transfer/ec_connector/cpu/worker/__init__.py",
    "vllm/distributed/ec_transfer/ec_connector/cpu/worker/descriptor_buffers.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py",
    "vllm/utils/math_utils.py",
    "vllm/v1/kv_offload/base.py",
    "vllm/v1/kv_offload/config.py",
    "vllm/v1/kv_offload/cpu/common.py",
    "vllm/v1/kv_offload/cpu/gpu_worker.py",
    "vllm/v1/kv_offload/cpu/shared_offload_region.py",
    "vllm/v1/metrics/cache_hit_source.py",
)


def sdist_url(name: str, sha256: str) -> str:
    """The download address of the sdist *name*, from the index's JSON page."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        page = json.load(response)
    for file in page["files"]:
        if file["filename"] == name:
            if file["hashes"].get("sha256") != sha256:
                raise SystemExit(f"{INDEX} lists {name} with another sha256: {file['hashes']}")
            return str(file["url"])
    raise SystemExit(f"{INDEX} lists no {name}")


def download(name: str, sha256: str, archive: Path) -> None:
    """Download the sdist *name* to *archive*, checking its SHA-256."""
    digest = hashlib.sha256()
    with (
        urllib.request.urlopen(sdist_url(name, sha256), timeout=300) as response,
        archive.open("wb") as out,
    ):
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"{name}: sha256 {digest.hexdigest()}, expected {sha256}")


def extract(tar: tarfile.TarFile, prefix: str, names: tuple[str, ...], target: Path) -> None:
    """Extract *names* (under *prefix* in *tar*) into *target*, replacing it whole."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for name in names:
        source = tar.extractfile(tar.getmember(prefix + name))
        if source is None:
            raise SystemExit(f"{prefix}{name} is not a file")
        out = partial / name.partition("/")[2]  # tests/... into target, vllm/... likewise
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(source.read())
    (partial / STAMP).write_text(prefix.rstrip("/") + ".tar.gz\n")
    shutil.rmtree(target, ignore_errors=True)  # another version's files, or a partial set
    partial.rename(target)


def main(version: str, destination: Path, modules: bool) -> None:
    """Download and check *version*'s sdist; extract what is asked into *destination*."""
    name = f"vllm-{version}.tar.gz"
    wanted = {destination / "tests": TEST_FILES}
    if modules:
        wanted[destination / "site" / "vllm"] = MODULES
    missing = {
        target: names
        for target, names in wanted.items()
        if not (target / STAMP).is_file() or (target / STAMP).read_text().strip() != name
    }
    if not missing:
        return
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / name
        download(name, SHA256[version], archive)
        with tarfile.open(archive) as tar:
            for target, names in missing.items():
                extract(tar, f"vllm-{version}/", names, target)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    with_modules = "--modules" in arguments
    if with_modules:
        arguments.remove("--modules")
    if len(arguments) != 2 or arguments[0] not in SHA256:
        raise SystemExit(f"usage: {sys.argv[0]} [--modules] VERSION DESTINATION ({list(SHA256)})")
    main(arguments[0], Path(arguments[1]), with_modules)
