"""Serve vLLM's descriptor pools: `descriptor_pool_factory` for its hook, else `install`.

`install` puts bucketpool's adapters in place of vLLM's ``DescriptorBufferPool``, `uninstall`
takes them out; vLLM is imported only when they or `plugin` run.  `install` was tested with
vLLM 0.33.0 and 0.34.0; on another it installs nothing unless told to (``untested=True``),
and says so in vLLM's log.  `plugin` is bucketpool's ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import operator
import os
import sys
import threading
import typing
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType

import attrs
import torch

from bucketpool import _copies, _hook, _kv_offload, compat
from bucketpool._hook import DescriptorPool, DescriptorSpec
from bucketpool._kv_offload import _descriptors, _holder
from bucketpool._pool import BucketPool
from bucketpool.compat import _Adapter

__all__ = [
    "DescriptorPool",
    "DescriptorSpec",
    "InstallResult",
    "descriptor_pool_factory",
    "install",
    "installed",
    "plugin",
    "uninstall",
]

_TESTED = ("0.33.0", "0.34.0")  # the vLLM versions bucketpool.vllm was tested with

_CANONICAL_PATH = "vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_LEGACY_PATH = "vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers"
_PATHS = (_CANONICAL_PATH, _LEGACY_PATH)
_TENSOR_FIELDS = ("src_ptrs", "dst_ptrs", "sizes")
_ALIASED_FIELDS = (*_TENSOR_FIELDS, "src_np", "dst_np", "sizes_np")
_VLLM_REQUIRED = (  # (a constraints file keeping torch makes pip fail: vLLM pins its own)
    "bucketpool.vllm.install() needs vLLM, which is not installed here. vLLM pins the torch it "
    "is built for (0.33.0: torch==2.14.0), so 'pip install vllm' would replace torch {torch}. "
    "To keep it: pip install --no-deps vllm==VERSION (bucketpool is tested with "
    f"{' and '.join(_TESTED)}), then vLLM's other requirements by hand ('pip show vllm' "
    "names them), leaving out torch and what is built for one torch (torchvision, torchaudio)"
)
_UNTESTED = (
    "bucketpool.vllm.install() installed nothing: bucketpool is tested with vLLM %s, not %s. "
    "install(untested=True), or BUCKETPOOL_VLLM_UNTESTED=1 for the plugin, installs it all "
    "the same"
)
_PARTS = {"": None, "ec": False, "ec,kv": True}  # $BUCKETPOOL_VLLM: install's kv_offload
_HOSTS = ("vllm", "vllm_ascend")  # the packages whose modules may bind vLLM's classes
_RECORD = "__bucketpool_installed__"  # on vLLM's module: the `_Installed` of the install there
_Swaps = tuple[tuple[object, object], ...]  # (original, replacement) pairs
_logger = logging.getLogger("vllm.bucketpool")  # under vLLM's: its handler, its level


@typing.final
@attrs.frozen
class InstallResult:
    """What `install` did, and with which vLLM.

    Attributes:
        installed: True once the call has put bucketpool in place (or found it there);
            False where vLLM's version is not one bucketpool was tested with and
            ``untested`` was not given: the call did nothing.
        vllm_version: ``vllm.__version__`` ("unknown" where vLLM has none).
        tested: whether bucketpool was tested with that version, 0.33.0 or 0.34.0 (a local
            label, as in ``0.33.0+cu129``, aside).
    """

    installed: bool
    vllm_version: str
    tested: bool


@attrs.frozen
class _Installed:
    """What `install` did: the module it patched, its swaps, each ``(module, name, old, new)``."""

    target: ModuleType
    swaps: _Swaps
    bound: tuple[tuple[ModuleType, str, object, object], ...]
    wrapped: tuple[tuple[type, str, object, object], ...] = ()  # (class, name, old, new)
    ops: _Swaps = ()  # (vLLM's copy op, `_copies.recording` of it)


# `importlib.reload` keeps the lock and the record of an install in effect.
_lock: threading.Lock = globals().get("_lock") or threading.Lock()
_installed: _Installed | None = globals().get("_installed")


def install(*, kv_offload: bool = False, untested: bool = False) -> InstallResult:
    """Make vLLM's EC CPU worker, and its KV-offload handlers if asked, use bucketpool.

    Rebinds ``DescriptorBufferPool`` and ``DescriptorBuffers`` wherever vLLM's (and
    vllm-ascend's) modules bind them, and wraps ``ECCPUWorker.shutdown`` to release the
    triples it drops (docs/compat.md).  Only pools created afterwards are bucketpool's: call
    it in every process before vLLM builds its workers.  Again while installed: nothing more
    (with *kv_offload*: serves modules imported since).  All or nothing: one that raises
    has changed nothing.  On a vLLM bucketpool was not tested with, nothing, and one warning
    in vLLM's log (logger ``vllm.bucketpool``).  Serialised by a lock.

    Args:
        kv_offload: also serve vLLM's (and vllm-ascend's) KV-offload handlers.  vLLM's KV
            offload pins memory, so it needs an accelerator: without one, leave it False.
        untested: install on a vLLM version bucketpool was not tested with, too.

    Returns:
        Whether it installed, and which vLLM it found.

    Raises:
        ImportError: no vLLM, no EC CPU ``descriptor_buffers`` module or (*kv_offload*) no
            KV-offload worker; `ModuleNotFoundError` naming a module vLLM imports that is
            not installed.
        RuntimeError: vLLM's descriptors are of fields or dtypes bucketpool cannot serve, or
            (*kv_offload*) vLLM asks for pinned ones where torch cannot pin.
    """
    with _lock:
        version = _vllm_version()
        tested = version.partition("+")[0] in _TESTED
        if not (tested or untested):
            _logger.warning(_UNTESTED, " and ".join(_TESTED), version)
            return InstallResult(installed=False, vllm_version=version, tested=False)
        stale = _record()
        ec = None
        if stale is None or not _in_effect(stale):
            module = _find_target(version)
            ec = module, _adapters(module)  # vLLM's pool asked; nothing changed yet
        if kv_offload:  # it replaces all or nothing, so it goes before the EC part
            importlib.import_module("vllm.v1.kv_offload.cpu.gpu_worker")
            _install_kv()
        if ec is not None:
            _install_ec(stale, *ec)
        elif stale is not None:
            _wrap_new_ops(stale)
    return InstallResult(installed=True, vllm_version=version, tested=tested)


def plugin() -> None:
    """Serve vLLM as ``$BUCKETPOOL_VLLM`` says: vLLM runs it in every process it starts.

    bucketpool's ``vllm.general_plugins`` entry point, named ``bucketpool`` (the name
    ``$VLLM_PLUGINS`` selects it by).  ``BUCKETPOOL_VLLM`` unset or empty: nothing;
    ``ec``: vLLM's EC CPU worker; ``ec,kv``: its KV-offload handlers too.  Through vLLM's
    descriptor-pool hook where it has one (`descriptor_pool_factory`, nothing rebound), else
    by `install` (``BUCKETPOOL_VLLM_UNTESTED=1``: ``untested=True``; unset or empty: not).

    Raises:
        ValueError: either variable holds another value; nothing was installed.
        ImportError: as `install`.
        RuntimeError: as `install`.
    """
    parts = os.environ.get("BUCKETPOOL_VLLM", "")
    untested = os.environ.get("BUCKETPOOL_VLLM_UNTESTED", "")
    if parts not in _PARTS:
        raise ValueError(
            f"BUCKETPOOL_VLLM={parts!r}: bucketpool's vLLM plugin accepts 'ec' (install()), "
            "'ec,kv' (install(kv_offload=True)), or nothing (unset or empty)"
        )
    if untested not in ("", "1"):
        raise ValueError(
            f"BUCKETPOOL_VLLM_UNTESTED={untested!r}: bucketpool's vLLM plugin accepts '1' "
            "(install on a vLLM bucketpool was not tested with), or nothing (unset or empty)"
        )
    kv_offload = _PARTS[parts]
    if kv_offload is not None and (hook := _hook.find()) is not None:
        hook.set_descriptor_pool_factory(_hook.serving(kv_offload, descriptor_pool_factory))
    elif kv_offload is not None:
        install(kv_offload=kv_offload, untested=bool(untested))


def descriptor_pool_factory(spec: DescriptorSpec) -> DescriptorPool:
    """Return a new pool, over its own `BucketPool`, for the vLLM call site *spec* describes.

    The factory for vLLM's hook (docs/upstream.md): ``set_descriptor_pool_factory(this)``
    serves every call site; `plugin` sets one that serves those ``$BUCKETPOOL_VLLM`` names.

    Raises:
        TypeError: *spec* asks for a dtype other than int64 and uint64.
        ValueError: *spec* asks for pinned six-field descriptors (bucketpool pins triples).
        RuntimeError: *spec* asks for pinned memory where torch can pin none.
    """
    dtype = _hook.check(spec)
    if spec.aliased:
        adapter = compat.AliasedDescriptorBufferPool(dtype=dtype)
        lent = compat.AliasedDescriptorBuffers
        return _hook.HookPool(spec, adapter.pool, adapter.acquire, adapter.release, lent)
    pool = BucketPool(dtype=dtype, pin_memory=spec.pin_memory)
    give_back = functools.partial(_hook.give_back, _holder)
    return _hook.HookPool(spec, pool, functools.partial(_descriptors, pool), give_back)


def _install_kv() -> None:
    try:
        _kv_offload.install(_vllm_modules())
    except RuntimeError as error:
        try:
            torch.empty(0, pin_memory=True)
        except RuntimeError:
            raise RuntimeError(
                f"{error}. vLLM's KV offload pins memory, which needs an accelerator, and "
                "torch can pin none here: call bucketpool.vllm.install() without kv_offload"
            ) from error
        raise


def _install_ec(
    stale: _Installed | None, module: ModuleType, replacements: tuple[object, object]
) -> None:
    global _installed
    if stale is not None:
        _undo(stale)  # vLLM's module was reloaded or imported anew since
    originals = (module.DescriptorBufferPool, module.DescriptorBuffers)
    swaps: _Swaps = tuple(zip(originals, replacements, strict=True))
    if stale is not None:  # modules that did not reload still bind the classes it replaced
        swaps += tuple(
            (original, replacements[i % 2])
            for i, (original, _) in enumerate(stale.swaps)
            if original not in originals
        )
    modules = _vllm_modules(module)
    ops = tuple((op, _copies.recording(op)) for op in _copy_ops())
    rebindings = _rebindings(modules, swaps) + _rebindings(modules, ops)
    wrapped = _wrap_shutdown(module)
    for each, name, _, replacement in (*rebindings, *wrapped):
        setattr(each, name, replacement)
    _installed = _Installed(module, swaps, tuple(rebindings), wrapped, ops)
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
    reverse = {id(new): (new, old) for old, new in reversed((*record.swaps, *record.ops))}
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


def _vllm_version() -> str:
    """Import vLLM; return its version."""
    try:
        import vllm
    except ModuleNotFoundError as error:
        if error.name != "vllm":
            raise _missing_dependency(error) from error
        raise ImportError(_VLLM_REQUIRED.format(torch=torch.__version__), name="vllm") from None
    return str(getattr(vllm, "__version__", "unknown"))


def _find_target(version: str) -> ModuleType:
    """Import vLLM's descriptor-buffers module, from its canonical path or the older one."""
    for path in _PATHS:
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if path != missing and not path.startswith(missing + "."):
                raise _missing_dependency(error) from error  # the module exists; an import fails
    raise ImportError(
        f"vLLM {version} has no EC CPU connector descriptor-buffers module (looked for "
        f"{_CANONICAL_PATH} and {_LEGACY_PATH}); bucketpool.vllm.install() needs a vLLM "
        "with the ECCPUConnector's DescriptorBufferPool",
        name=_LEGACY_PATH,
    )


def _missing_dependency(error: ModuleNotFoundError) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"bucketpool.vllm.install(): vLLM imports {error.name!r}, which is not installed "
        f"({error}); install it, keeping torch {torch.__version__}: pip install -c c.txt "
        f"PACKAGE, c.txt holding torch=={torch.__version__} (pip then fails rather than "
        "replace torch)",
        name=error.name,
    )


def _wrap_new_ops(record: _Installed) -> None:
    """Wrap the copy ops imported since *record*'s install (the KV offload's Triton op)."""
    global _installed
    known = {id(each) for pair in record.ops for each in pair}
    ops = tuple((op, _copies.recording(op)) for op in _copy_ops() if id(op) not in known)
    rebindings = tuple(_rebindings(_vllm_modules(), ops))
    for module, name, _, replacement in rebindings:
        setattr(module, name, replacement)
    _installed = attrs.evolve(record, bound=record.bound + rebindings, ops=record.ops + ops)
    setattr(record.target, _RECORD, _installed)


def _copy_ops() -> list[Callable[..., object]]:
    """The ``swap_blocks_batch`` ops vLLM's workers call (the Triton one where imported).

    `_copies.recording` wraps each where vLLM's modules bind it: a copy of a pool's
    descriptors gets an end event on its hand-out, so a release before it parks (issue 35).
    """
    paths = ("vllm._custom_ops", "vllm.v1.kv_offload.cpu.swap_blocks_triton")
    found = (getattr(sys.modules.get(path), "swap_blocks_batch", None) for path in paths)
    return [op for op in found if callable(op)]


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
        if not isinstance(pool, _Adapter):  # vLLM's own pool, or none (a test's mock)
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
    """Return the pool class and tuple class that stand in for *module*'s classes."""
    fields: object = getattr(module.DescriptorBuffers, "_fields", None)
    if fields == _TENSOR_FIELDS:
        pool_class: type[_Adapter[typing.Any]]
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
    return _pool_class(pool_class, dtype), buffers


def _pool_class(
    adapter: type[_Adapter[typing.Any]], vllm_dtype: torch.dtype
) -> type[_Adapter[typing.Any]]:
    """The class put in place of vLLM's pool: *adapter*'s, with *vllm_dtype* by default.

    It subclasses what the adapters share, as they are final, and is open to subclasses as
    vLLM's is (vllm-ascend's subclass vLLM's classes).  A new class per install, so that
    `uninstall` tells it from an adapter a module binds on purpose.
    """

    class DescriptorBufferPool(_Adapter[typing.Any]):
        """vLLM's pool while `install` is in effect: a compat adapter with vLLM's dtype."""

        _held = adapter._held
        _fields = adapter._fields

        def __init__(self, *, dtype: torch.dtype = vllm_dtype) -> None:
            super().__init__(dtype=dtype)

    return DescriptorBufferPool


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
