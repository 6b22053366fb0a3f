"""Say whether this Python has a torch that satisfies a requirement; optionally lend it.

Usage: python .ci/has_torch.py [--pth FILE] [REQUIREMENT]

Exits 0 when the torch this interpreter finds satisfies REQUIREMENT (by default the
package's own, ``torch>=2.4`` in pyproject.toml), 1 when it has none or another, saying
which on stdout. Prereleases count, as pip counts an installed one: a source build such as
``2.6.0a0+git1234`` satisfies ``torch>=2.4``. With ``--pth``, a satisfying torch is also lent
to another environment: FILE (a ``.pth`` file in that environment's site-packages) puts
the directory torch is in on its ``sys.path``, after its own site-packages, so pip there
finds torch installed. Only that directory: ``.pth`` files in it (another project's editable
install) are not run.

`.ci/setup` runs it with the Python that makes ``.venv`` (lending its torch to ``.venv``),
then with ``.venv``'s, and installs torch only when that says no.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ModuleNotFoundError:  # a bare venv has only pip, which carries a copy
    try:
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    except ModuleNotFoundError:
        raise SystemExit("cannot check: this Python has neither packaging nor pip") from None

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's copy
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def package_requirement() -> Requirement:
    """The package's own torch requirement, from pyproject.toml."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == "torch":
            return requirement
    raise SystemExit(f"{PYPROJECT}: no torch among the dependencies")


def main() -> int:
    """Check the torch this Python finds; with ``--pth``, lend it. Return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("requirement", nargs="?", help="default: the package's requirement")
    parser.add_argument("--pth", type=Path, help="a .pth file to write when torch satisfies")
    args = parser.parse_args()
    try:
        requirement = Requirement(args.requirement) if args.requirement else package_requirement()
    except InvalidRequirement as error:
        print(f"cannot check for {args.requirement!r}: {error}")
        return 1
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        print("no torch here")
        return 1
    location = Path(spec.origin).parent.parent
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        print(f"torch in {location} has no installed version")
        return 1
    if not requirement.specifier.contains(version, prereleases=True):
        print(f"torch {version} in {location} does not satisfy {requirement}")
        return 1
    if args.pth is not None:
        args.pth.write_text(f"{location}\n")
    print(f"torch {version} in {location} satisfies {requirement}: kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
