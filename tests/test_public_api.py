"""The package's public surface: ``__all__`` lists, final classes, private modules' ``__all__``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
import types
import typing

import pytest

import bench
import bucketpool

#: The public modules, each with the names it defines or re-exports.
PUBLIC_MODULES = [
    name
    for name in ("bucketpool", "bucketpool.compat", "bucketpool.testing", "bucketpool.vllm")
    if importlib.util.find_spec(name) is not None
]
PRIVATE_MODULES = [
    f"bucketpool.{info.name}"
    for info in pkgutil.iter_modules(bucketpool.__path__)
    if info.name.startswith("_")
] + [
    # The benchmark, beside the package: private modules behind `python -m bench`.
    "bench",
    *(f"bench.{info.name}" for info in pkgutil.iter_modules(bench.__path__)),
]


def bucketpool_api(module: types.ModuleType) -> dict[str, object]:
    """Public classes and functions in *module*'s namespace that bucketpool defines."""
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__.split(".")[0] == "bucketpool"
    }


def isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps ``__all__`` in: CONSTANTS, then Classes, then the rest."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def exported(module: types.ModuleType) -> list[tuple[str, object]]:
    names: list[str] = module.__all__
    return [(name, getattr(module, name)) for name in names]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_sorted_unique_and_resolves(name: str) -> None:
    module = importlib.import_module(name)

    names: list[str] = module.__all__

    assert names == sorted(set(names), key=isort_style)
    assert all(hasattr(module, each) for each in names)


#: Public names that are type aliases, not classes or functions.
TYPE_ALIASES = {"DebugLevel"}


def test_package_all_is_exactly_its_public_api() -> None:
    assert set(bucketpool_api(bucketpool)) | TYPE_ALIASES == set(bucketpool.__all__)
    assert typing.get_args(bucketpool.DebugLevel) == ("off", "checks", "strict")


@pytest.mark.parametrize("name", [name for name in PUBLIC_MODULES if name != "bucketpool"])
def test_public_module_all_lists_what_it_defines(name: str) -> None:
    # Exact for what the module defines itself.  Names it merely imports for its own use
    # (compat imports BucketPool, BufferHandle, ...) may stay out of __all__: mypy's strict
    # mode (no implicit re-export) already stops users importing them from there.
    module = importlib.import_module(name)
    api = bucketpool_api(module)
    defined_here = {each for each, value in api.items() if value.__module__ == name}

    assert defined_here <= set(module.__all__)
    assert {each for each, _ in exported(module)} <= set(api)


@pytest.mark.parametrize("name", PRIVATE_MODULES)
def test_private_modules_define_all(name: str) -> None:
    module = importlib.import_module(name)

    names = getattr(module, "__all__", None)

    assert isinstance(names, list), f"{name} has no __all__ list"
    assert names == sorted(set(names), key=isort_style)
    assert all(hasattr(module, each) for each in names)


def is_open_by_design(cls: type) -> bool:
    """Whether *cls* is exempt from ``@final``, and why.

    - NamedTuples: a value type whose fields are its whole contract; a subclass cannot add
      fields, and the compat tuples mirror vLLM's, which are not final either.
    - Protocols (`CompletionEvent`): users implement them, and may subclass them to do so.
    - Exception bases that bucketpool itself subclasses (`PoolError`): they exist to be
      caught as a family, and user code may extend them.
    """
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return True
    if getattr(cls, "_is_protocol", False):
        return True
    return issubclass(cls, BaseException) and any(
        sub.__module__.startswith("bucketpool") for sub in cls.__subclasses__()
    )


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="typing.final records __final__ from Python 3.11 on"
)
@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_classes_are_final(name: str) -> None:
    module = importlib.import_module(name)
    classes = [(each, value) for each, value in exported(module) if inspect.isclass(value)]

    not_final = [
        each
        for each, cls in classes
        if not getattr(cls, "__final__", False) and not is_open_by_design(cls)
    ]

    assert not_final == []


def test_the_exemptions_are_the_expected_ones() -> None:
    classes = {
        each: value
        for name in PUBLIC_MODULES
        for each, value in exported(importlib.import_module(name))
        if inspect.isclass(value)
    }

    open_by_design = {each for each, cls in classes.items() if is_open_by_design(cls)}

    # Exactly these: a new public class is final unless it is added here, with its reason.
    assert open_by_design == {
        "AliasedDescriptorBuffers",
        "CompletionEvent",
        "DescriptorBuffers",
        "DescriptorPool",  # bucketpool.vllm's Protocols: what vLLM's hook passes and takes
        "DescriptorSpec",
        "PoolError",
    }
    assert not open_by_design & {"BucketPool", "BufferHandle", "PoolStats", "ReleaseError"}
    for each in open_by_design:  # open, not final with a forgotten exemption
        assert not getattr(classes[each], "__final__", False), each
