"""Put bucketpool's adapters in place of vLLM's ``DescriptorBufferPool``, and take them out.

vLLM is not a dependency of bucketpool: it is imported only when `install` runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
import sys
import threading
import typing
from collections.abc import Iterable, Sequence
from types import ModuleType

import attrs
import torch

from bucketpool import _kv_offload, compat

__all__ = ["install", "installed", "uninstall"]

_CANONICAL_PATH = "vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_LEGACY_PATH = "vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_PATHS = (_CANONICAL_PATH, _LEGACY_PATH)
_TENSOR_FIELDS = ("src_ptrs", "dst_ptrs", "sizes")
_ALIASED_FIELDS = (*_TENSOR_FIELDS, "src_np", "dst_np", "sizes_np")
_VLLM_REQUIRED = (
    "bucketpool.vllm.install() needs vLLM, which is not installed here. 'pip install vllm' "
    "would replace torch {torch} with the one vLLM pins; to keep it: pip install vllm -c c.txt "
    "with torch=={torch} in c.txt, or pip install --no-deps vllm==VERSION and its requirements"
)
_ADAPTERS = (compat.DescriptorBufferPool, compat.AliasedDescriptorBufferPool)
_HOSTS = ("vllm", "vllm_ascend")  # the packages whose modules may bind vLLM's classes
_RECORD = "__bucketpool_installed__"  # on vLLM's module: the `_Installed` of the install there
_Swaps = tuple[tuple[object, object], ...]  # (original, replacement) pairs


@attrs.frozen
class _Installed:
    """What `install` did: the module it patched, its swaps, each ``(module, name, old, new)``."""

    target: ModuleType
    swaps: _Swaps
    bound: tuple[tuple[ModuleType, str, object, object], ...]
    wrapped: tuple[tuple[type, str, object, object], ...] = ()  # (class, name, old, new)


# `importlib.reload` keeps the lock and the record of an install in effect.
_lock: threading.Lock = globals().get("_lock") or threading.Lock()
_installed: _Installed | None = globals().get("_installed")


def install(*, kv_offload: bool = False) -> None:
    """Make vLLM's EC CPU worker, and its KV-offload handlers if asked, use bucketpool.

    Rebinds ``DescriptorBufferPool`` and ``DescriptorBuffers`` wherever vLLM's (and
    vllm-ascend's) modules bind them, and wraps ``ECCPUWorker.shutdown`` to release the
    triples it drops (docs/compat.md).  Only pools created afterwards are bucketpool's: call
    it in every process before vLLM builds its workers.  Again while installed: nothing more
    (with *kv_offload*: serves modules imported since).  Serialised by a lock.

    Args:
        kv_offload: also serve vLLM's (and vllm-ascend's) KV-offload handlers.

    Raises:
        ImportError: no vLLM, no EC CPU ``descriptor_buffers`` module or (*kv_offload*) no
            KV-offload worker; `ModuleNotFoundError` naming a module vLLM imports that is
            not installed.
        RuntimeError: vLLM's descriptors are of fields or dtypes bucketpool cannot serve;
            nothing of that part was replaced (the EC part installs first).
    """
    with _lock:
        _install_ec()
        if kv_offload:
            importlib.import_module("vllm.v1.kv_offload.cpu.gpu_worker")
            _kv_offload.install(_vllm_modules())


def _install_ec() -> None:
    global _installed
    stale = _record()
    if stale is not None:
        if _in_effect(stale):
            return
        _undo(stale)  # vLLM's module was reloaded or imported anew since
    module = _find_target()
    originals = (module.DescriptorBufferPool, module.DescriptorBuffers)
    replacements = _adapters(module)
    swaps: _Swaps = tuple(zip(originals, replacements, strict=True))
    if stale is not None:  # modules that did not reload still bind the classes it replaced
        swaps += tuple(
            (original, replacements[i % 2])
            for i, (original, _) in enumerate(stale.swaps)
            if original not in originals
        )
    rebindings = _rebindings(_vllm_modules(module), swaps)
    wrapped = _wrap_shutdown(module)
    for each, name, _, replacement in (*rebindings, *wrapped):
        setattr(each, name, replacement)
    _installed = _Installed(module, swaps, tuple(rebindings), wrapped)
    setattr(module, _RECORD, _installed)


def uninstall() -> None:
    """Put vLLM's own classes back wherever `install`'s are bound (made pools keep working)."""
    with _lock:
        record = _record()
        if record is not None:
            _undo(record)
        undone = _kv_offload.uninstall()  # and where modules bound its factory since:
        for module, name, _, original in _rebindings(_vllm_modules(), undone):
            setattr(module, name, original)


def installed() -> bool:
    """Return whether `install` is in effect (False once vLLM's module is imported anew)."""
    record = _record()
    return record is not None and _in_effect(record)


def _undo(record: _Installed) -> None:
    """Rebind every replacement *record* made back to its original; forget the record."""
    global _installed
    for module, name, original, replacement in (*record.bound, *record.wrapped):
        if vars(module).get(name) is replacement:
            setattr(module, name, original)
    # Bindings made to the replacements since get the first original each replaced.
    reverse = {id(new): (new, old) for old, new in reversed(record.swaps)}
    modules = _vllm_modules(*(module for module, _, _, _ in record.bound))
    for module, name, _, original in _rebindings(modules, tuple(reverse.values())):
        setattr(module, name, original)
    if getattr(record.target, _RECORD, None) is record:
        delattr(record.target, _RECORD)
    _installed = None


def _record() -> _Installed | None:
    """The install not undone (in effect or not), if its vLLM module still holds its record."""
    candidates = [getattr(sys.modules.get(path), _RECORD, None) for path in _PATHS]
    for found in (_installed, *candidates):
        # Perhaps made by another copy of this module: an `_Installed` of that copy's class.
        record = typing.cast("_Installed | None", found)
        if record is not None and getattr(record.target, _RECORD, None) is record:
            return record
    return None


def _in_effect(record: _Installed) -> bool:
    """Whether the module *record* patched is still vLLM's, with bucketpool's pool in it."""
    target = record.target
    current = sys.modules.get(target.__name__) is target
    return current and getattr(target, "DescriptorBufferPool", None) is record.swaps[0][1]


def _find_target() -> ModuleType:
    """Import vLLM's descriptor-buffers module, from its canonical path or the older one."""
    try:
        import vllm
    except ModuleNotFoundError as error:
        if error.name != "vllm":
            raise _missing_dependency(error) from error
        raise ImportError(_VLLM_REQUIRED.format(torch=torch.__version__), name="vllm") from None
    for path in _PATHS:
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if path != missing and not path.startswith(missing + "."):
                raise _missing_dependency(error) from error  # the module exists; an import fails
    version = getattr(vllm, "__version__", "(unknown version)")
    raise ImportError(
        f"vLLM {version} has no EC CPU connector descriptor-buffers module (looked for "
        f"{_CANONICAL_PATH} and {_LEGACY_PATH}); bucketpool.vllm.install() needs a vLLM "
        "with the ECCPUConnector's DescriptorBufferPool",
        name=_LEGACY_PATH,
    )


def _missing_dependency(error: ModuleNotFoundError) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"bucketpool.vllm.install(): vLLM imports {error.name!r}, which is not installed "
        f"({error}); install it or vLLM's requirements (keep torch {torch.__version__}: pip "
        f"install -c c.txt, c.txt holding torch=={torch.__version__})",
        name=error.name,
    )


def _wrap_shutdown(module: ModuleType) -> tuple[tuple[type, str, object, object], ...]:
    """Wrap ``ECCPUWorker.shutdown`` to release the triples it drops once their copies are done.

    Returns ``(class, name, old, new)`` for `install` to bind, or nothing without the worker.
    """
    worker = getattr(sys.modules.get(module.__name__.rpartition(".")[0]), "ECCPUWorker", None)
    original = vars(worker).get("shutdown") if isinstance(worker, type) else None
    if worker is None or not callable(original):
        return ()

    @functools.wraps(original)
    def shutdown(self: typing.Any) -> None:
        pool = getattr(self, "_buf_pool", None)
        if not isinstance(pool, _ADAPTERS):  # vLLM's own pool, or none (a test's mock)
            original(self)
            return
        flights = (*getattr(self, "_inflight_saves", ()), *getattr(self, "_inflight_loads", ()))
        held = [(getattr(each, "bufs", None), getattr(each, "end_event", None)) for each in flights]
        held.append((getattr(self, "_save_bufs", None), None))  # (a test's may lack any field)
        try:
            original(self)  # its events synchronised: no copy reads the triples any more
        finally:  # given back also when it raised: parked on their end events, if pending
            for bufs, event in held:
                if bufs:  # (a tuple of three or six fields is true)
                    with contextlib.suppress(Exception):  # released already, not this pool's,
                        pool.release(bufs, event=event)  # or a lost device's query(): parked
        pool.pool.synchronize()

    return ((worker, "shutdown", original, shutdown),)


def _adapters(module: ModuleType) -> tuple[object, object]:
    """Return the pool factory and tuple class that stand in for *module*'s classes.

    The factory is a partial (the compat classes are final) carrying vLLM's dtype; this
    install's own object, it lets `uninstall` spare modules that use bucketpool on purpose.
    """
    fields: object = getattr(module.DescriptorBuffers, "_fields", None)
    if fields == _TENSOR_FIELDS:
        pool_class: type[compat.DescriptorBufferPool | compat.AliasedDescriptorBufferPool]
        buffers: type[compat.DescriptorBuffers | compat.AliasedDescriptorBuffers]
        pool_class, buffers = compat.DescriptorBufferPool, compat.DescriptorBuffers
    elif fields == _ALIASED_FIELDS:
        pool_class, buffers = compat.AliasedDescriptorBufferPool, compat.AliasedDescriptorBuffers
    else:
        raise RuntimeError(
            f"{module.__name__}.DescriptorBuffers has fields {fields!r}; bucketpool.vllm knows "
            f"{_TENSOR_FIELDS!r} and {_ALIASED_FIELDS!r}, so this vLLM is not supported yet. "
            "Nothing was replaced"
        )
    dtype, _ = _kv_offload.probe(
        lambda: operator.attrgetter(*_TENSOR_FIELDS)(module.DescriptorBufferPool().acquire(1)),
        f"{module.__name__}.DescriptorBufferPool().acquire(1)",
    )
    return functools.partial(pool_class, dtype=dtype), buffers


def _vllm_modules(*first: ModuleType) -> list[ModuleType]:
    """Return *first* and every imported ``vllm`` and ``vllm_ascend`` module, each once."""
    found = {id(module): module for module in first}
    for name, module in list(sys.modules.items()):  # a snapshot: others may import meanwhile
        if name.partition(".")[0] in _HOSTS and isinstance(module, ModuleType):
            found.setdefault(id(module), module)
    return list(found.values())


def _rebindings(
    modules: Iterable[ModuleType], swaps: Sequence[tuple[object, object]]
) -> list[tuple[ModuleType, str, object, object]]:
    """Return ``(module, name, old, new)`` for every global of *modules* that is an old one."""
    first = {id(old): (old, new) for old, new in reversed(swaps)}  # the first pair of each old
    return [
        (module, name, *first[id(value)])
        for module in modules
        for name, value in list(vars(module).items())  # no module __getattr__ is called
        if id(value) in first
    ]
