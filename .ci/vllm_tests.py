"""Fetch the vLLM test files tests/test_vllm_tests.py runs on its wheel, from vLLM's sdist.

Usage: python .ci/vllm_tests.py DESTINATION (a directory; the files go to DESTINATION/tests).
Nothing is fetched when every file is there already.

The sdist is found through PyPI's simple API in JSON (``pip download --no-binary`` downloads
it but then fails building its metadata), checked against the pinned SHA-256, and only the
files below are extracted: nothing of vLLM is copied into this repository.
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

VERSION = "0.33.0"
SDIST = f"vllm-{VERSION}.tar.gz"
SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
INDEX = "https://pypi.org/simple/vllm/"
FILES = (
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


def sdist_url() -> str:
    """The download address of `SDIST`, from the index's JSON page."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        page = json.load(response)
    for file in page["files"]:
        if file["filename"] == SDIST:
            if file["hashes"].get("sha256") != SHA256:
                raise SystemExit(f"{INDEX} lists {SDIST} with another sha256: {file['hashes']}")
            return str(file["url"])
    raise SystemExit(f"{INDEX} lists no {SDIST}")


def main(destination: Path) -> None:
    """Download and check the sdist; extract `FILES` into *destination*/tests."""
    if all((destination / name).is_file() for name in FILES):
        return
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / SDIST
        digest = hashlib.sha256()
        with (
            urllib.request.urlopen(sdist_url(), timeout=300) as response,
            archive.open("wb") as out,
        ):
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != SHA256:
            raise SystemExit(f"{SDIST}: sha256 {digest.hexdigest()}, expected {SHA256}")
        partial = destination / "tests.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(archive) as tar:
            for name in FILES:
                member = tar.getmember(f"vllm-{VERSION}/{name}")
                source = tar.extractfile(member)
                if source is None:
                    raise SystemExit(f"{SDIST}: {name} is not a file")
                target = partial / name.removeprefix("tests/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read())
        shutil.rmtree(destination / "tests", ignore_errors=True)  # an older set of files
        partial.rename(destination / "tests")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
