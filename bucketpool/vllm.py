"""Put bucketpool's adapters in place of vLLM's ``DescriptorBufferPool``, and take them out.

vLLM's EC CPU connector keeps its ``swap_blocks_batch`` descriptors in a
``DescriptorBufferPool`` defined in
``vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers`` (newer versions:
``vllm.backends.distributed...``, the older path being an alias of it).  `install` replaces
that class, and the ``DescriptorBuffers`` tuple class beside it, with the matching
`bucketpool.compat` adapter, so that every pool vLLM makes afterwards is a `BucketPool`.
vLLM is not a dependency of bucketpool: it is imported only when `install` runs.
"""

from __future__ import annotations

import functools
import sys
import threading
import typing
from collections.abc import Iterable, Sequence
from types import ModuleType

import attrs
import torch

from bucketpool import compat

if typing.TYPE_CHECKING:
    from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
        DescriptorBufferPool as VllmDescriptorBufferPool,
    )
    from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
        _AliasedDescriptorBuffers,
        _TensorDescriptorBuffers,
    )

__all__ = ["install", "installed", "uninstall"]

_CANONICAL_PATH = "vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_LEGACY_PATH = "vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_TARGET_PATHS = (_CANONICAL_PATH, _LEGACY_PATH)
_TENSOR_FIELDS = ("src_ptrs", "dst_ptrs", "sizes")
_ALIASED_FIELDS = (*_TENSOR_FIELDS, "src_np", "dst_np", "sizes_np")
_POINTER_DTYPES = (torch.int64, torch.uint64)
_VLLM_REQUIRED = (
    "bucketpool.vllm.install() needs vLLM, which is not installed in this environment; "
    "install it with 'pip install vllm' (bucketpool itself does not depend on vLLM)"
)


@attrs.frozen
class _Target:
    """vLLM's descriptor-buffers module and the two classes it defines."""

    module: ModuleType
    pool: type[VllmDescriptorBufferPool]
    buffers: type[_TensorDescriptorBuffers] | type[_AliasedDescriptorBuffers]


@attrs.frozen
class _Installed:
    """What `install` did: which objects it swapped, and the modules it rebound them in."""

    target: ModuleType  # vLLM's descriptor-buffers module, which holds this record
    swaps: tuple[tuple[object, object], ...]  # (original, replacement) pairs
    #: Each name it rebound, even in modules since gone from sys.modules: (module, name,
    #: original, replacement), so that each gets back the very object it had.
    bound: tuple[tuple[ModuleType, str, object, object], ...]


#: The attribute, on vLLM's descriptor-buffers module, that holds what `install` did there.
_RECORD = "__bucketpool_installed__"

# `importlib.reload` runs this module again in its own namespace: the lock it had and the
# record of an install in effect are kept, not replaced (a record is also kept on the vLLM
# module it patched, which a fresh import of this module finds).
_lock: threading.Lock = globals().get("_lock") or threading.Lock()
_installed: _Installed | None = globals().get("_installed")


def install() -> None:
    """Make vLLM's EC CPU worker use bucketpool's pool instead of its own.

    Rebinds ``DescriptorBufferPool`` and ``DescriptorBuffers`` in vLLM's descriptor-buffers
    module and in every already-imported ``vllm.*`` module that bound either original (under
    any name, such as the EC CPU worker's ``from ... import DescriptorBufferPool``).  The
    adapter matches the installed shape: three fields give
    `compat.DescriptorBufferPool`, six fields (numpy aliases and ``add_copies``) give
    `compat.AliasedDescriptorBufferPool`.  Pools keep the pointer dtype vLLM's own pool uses
    (int64, or uint64 on XPU).  Only pools created afterwards are bucketpool's: call this
    before vLLM builds its workers, in every process that builds one (for example from a
    ``vllm.general_plugins`` entry point).  Calling it again while installed does nothing.

    Thread-safe: `install` and `uninstall` are serialised by a lock.  The rebinding is not
    atomic for threads already running vLLM code, which may see one name replaced before the
    other; pools they made earlier stay vLLM's and keep working.

    Raises:
        ImportError: vLLM is not installed, or has no EC CPU ``descriptor_buffers`` module.
        RuntimeError: vLLM's ``DescriptorBuffers`` has neither known set of fields, or its
            pool's tensors are not of one int64 or uint64 dtype; nothing was replaced.
    """
    global _installed
    with _lock:
        stale = _record()
        if stale is not None:
            if _in_effect(stale):
                return
            _undo(stale)  # vLLM's module was reloaded or imported anew since
        target = _find_target()
        pool, buffers = _adapters(target)
        swaps: tuple[tuple[object, object], ...] = ((target.pool, pool), (target.buffers, buffers))
        if stale is not None:  # modules that did not reload still bind the classes it replaced
            kept = (target.pool, target.buffers)
            swaps += tuple(
                (original, (pool, buffers)[i % 2])
                for i, (original, _) in enumerate(stale.swaps)
                if original not in kept
            )
        rebindings = _rebindings(_vllm_modules(target.module), swaps)
        for module, name, _, replacement in rebindings:
            setattr(module, name, replacement)
        _installed = _Installed(target.module, swaps, tuple(rebindings))
        setattr(target.module, _RECORD, _installed)


def uninstall() -> None:
    """Put vLLM's own ``DescriptorBufferPool`` and ``DescriptorBuffers`` back.

    Every binding that `install` made, and every binding a ``vllm.*`` module made to the
    replacements since, is restored to the very original object, also where the install is
    no longer in effect (vLLM's module was reloaded).  Bucketpool pools already created keep
    working until they are dropped.  Does nothing if not installed.

    Thread-safe, with the same caveat as `install`.
    """
    with _lock:
        record = _record()
        if record is not None:
            _undo(record)


def installed() -> bool:
    """Return whether `install` is in effect in this process.

    True also after ``importlib.reload(bucketpool.vllm)`` or a fresh import of it: the record
    of what `install` replaced lives on the vLLM module it patched as well.  False once
    vLLM's module was reloaded, or imported anew, since: its own classes are back.
    """
    record = _record()
    return record is not None and _in_effect(record)


def _undo(record: _Installed) -> None:
    """Rebind every replacement *record* made back to its original; forget the record."""
    global _installed
    for module, name, original, replacement in record.bound:
        if vars(module).get(name) is replacement:
            setattr(module, name, original)
    # Bindings made to the replacements since get the first original each replaced.
    reverse: dict[int, tuple[object, object]] = {}
    for original, replacement in record.swaps:
        reverse.setdefault(id(replacement), (replacement, original))
    modules = _vllm_modules(*(module for module, _, _, _ in record.bound))
    for module, name, _, original in _rebindings(modules, tuple(reverse.values())):
        setattr(module, name, original)
    if getattr(record.target, _RECORD, None) is record:
        delattr(record.target, _RECORD)
    _installed = None


def _record() -> _Installed | None:
    """What `install` did and `uninstall` has not undone (in effect or not), or None.

    The record on vLLM's module is the truth: this module's own reference counts only while
    that module still holds it (another copy of this module may have uninstalled since).
    Found from this module's reference, else among the modules already imported; nothing is
    imported.
    """
    candidates = [getattr(sys.modules.get(path), _RECORD, None) for path in _TARGET_PATHS]
    for found in (_installed, *candidates):
        if found is None:
            continue
        # Perhaps made by another copy of this module: an `_Installed` of that copy's class.
        record = typing.cast("_Installed", found)
        if getattr(record.target, _RECORD, None) is record:
            return typing.cast("_Installed", record)  # `is` narrowed it to Any
    return None


def _in_effect(record: _Installed) -> bool:
    """Whether the module *record* patched is still vLLM's, with bucketpool's pool in it."""
    target = record.target
    current = sys.modules.get(target.__name__) is target
    return current and getattr(target, "DescriptorBufferPool", None) is record.swaps[0][1]


def _find_target() -> _Target:
    """Import vLLM's descriptor-buffers module, from its canonical path or the older one."""
    try:
        import vllm
    except ModuleNotFoundError as error:
        if error.name != "vllm":
            raise
        raise ImportError(_VLLM_REQUIRED, name="vllm") from None
    for load, path in ((_load_canonical, _CANONICAL_PATH), (_load_legacy, _LEGACY_PATH)):
        try:
            return load()
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if path != missing and not path.startswith(missing + "."):
                raise  # the module exists but something it imports is missing
    version = getattr(vllm, "__version__", "(unknown version)")
    raise ImportError(
        f"vLLM {version} has no EC CPU connector descriptor-buffers module (looked for "
        f"{_CANONICAL_PATH} and {_LEGACY_PATH}); bucketpool.vllm.install() needs a vLLM "
        "with the ECCPUConnector's DescriptorBufferPool",
        name=_LEGACY_PATH,
    )


def _load_canonical() -> _Target:
    from vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker import (
        descriptor_buffers,
    )

    return _Target(
        descriptor_buffers,
        descriptor_buffers.DescriptorBufferPool,
        descriptor_buffers.DescriptorBuffers,
    )


def _load_legacy() -> _Target:
    from vllm.distributed.ec_transfer.ec_connector.cpu.worker import descriptor_buffers

    return _Target(
        descriptor_buffers,
        descriptor_buffers.DescriptorBufferPool,
        descriptor_buffers.DescriptorBuffers,
    )


def _adapters(target: _Target) -> tuple[object, object]:
    """Return the pool factory and tuple class that stand in for *target*'s classes.

    Raises:
        RuntimeError: unknown fields, or a pool whose tensors bucketpool cannot reproduce.
    """
    where = f"{target.module.__name__}.DescriptorBuffers"
    fields: object = getattr(target.buffers, "_fields", None)
    if fields == _TENSOR_FIELDS:
        pool_class: type[compat.DescriptorBufferPool | compat.AliasedDescriptorBufferPool]
        buffers: type[compat.DescriptorBuffers | compat.AliasedDescriptorBuffers]
        pool_class, buffers = compat.DescriptorBufferPool, compat.DescriptorBuffers
    elif fields == _ALIASED_FIELDS:
        pool_class, buffers = compat.AliasedDescriptorBufferPool, compat.AliasedDescriptorBuffers
    else:
        raise RuntimeError(
            f"{where} has fields {fields!r}; bucketpool.vllm knows {_TENSOR_FIELDS!r} and "
            f"{_ALIASED_FIELDS!r}, so this vLLM is not supported yet. Nothing was replaced"
        )
    # The replacement is a partial, not the class itself nor a subclass: the compat classes
    # are final, vLLM only ever calls DescriptorBufferPool() with no arguments, and the partial
    # carries the dtype that vLLM's own pool uses (uint64 on XPU) into that call.  Being an
    # object of this install alone, it also lets uninstall() find every binding of it without
    # touching a module that imported bucketpool's classes on purpose.
    return functools.partial(pool_class, dtype=_pointer_dtype(target, where)), buffers


def _pointer_dtype(target: _Target, where: str) -> torch.dtype:
    """Return the dtype of the tensors vLLM's own pool hands out, asking it for one entry.

    Asking the pool sees what it really allocates, whether the dtype is fixed (older vLLM) or
    chosen by platform in a private constant (later vLLM).
    """
    try:
        probe = target.pool().acquire(1)
        dtypes = (probe.src_ptrs.dtype, probe.dst_ptrs.dtype, probe.sizes.dtype)
    except Exception as error:
        raise RuntimeError(
            f"could not ask {target.module.__name__}.DescriptorBufferPool for the dtype of "
            f"its buffers ({type(error).__name__}: {error}); nothing was replaced"
        ) from error
    if len(set(dtypes)) != 1 or dtypes[0] not in _POINTER_DTYPES:
        raise RuntimeError(
            f"{where} tensors have dtypes {dtypes} (src_ptrs, dst_ptrs, sizes); bucketpool's "
            "adapters use one dtype, int64 or uint64, for all three, so this vLLM is not "
            "supported. Nothing was replaced"
        )
    return dtypes[0]


def _vllm_modules(*first: ModuleType) -> list[ModuleType]:
    """Return *first* and every imported ``vllm`` module, each module object once."""
    found = {id(module): module for module in first}
    # A snapshot: another thread may import modules while this runs.
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and isinstance(module, ModuleType):
            found.setdefault(id(module), module)
    return list(found.values())


def _rebindings(
    modules: Iterable[ModuleType], swaps: Sequence[tuple[object, object]]
) -> list[tuple[ModuleType, str, object, object]]:
    """Return ``(module, name, old, new)`` for every global of *modules* that is an old one."""
    found: list[tuple[ModuleType, str, object, object]] = []
    for module in modules:
        # Globals only, read from the namespace: a module-level __getattr__ (vLLM's lazy
        # compatibility shims) is never called, and nothing is imported.
        for name, value in list(vars(module).items()):
            for old, new in swaps:
                if value is old:
                    found.append((module, name, old, new))
                    break
    return found
