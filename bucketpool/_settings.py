"""A pool's settings: one frozen, validated record, resolved from arguments and environment."""

from __future__ import annotations

import operator
import os
import typing
from collections.abc import Mapping
from typing import Literal, SupportsIndex

import attrs
import torch

from bucketpool._buckets import DEFAULT_MAX_CAPACITY, DEFAULT_MIN_CAPACITY, check_power_of_two

__all__ = [
    "CONF_VARIABLE",
    "DEBUG_LEVELS",
    "DEBUG_VARIABLE",
    "DEFAULT_IDLE_TRIM_ACQUIRES",
    "DEFAULT_MAX_CACHED_BYTES",
    "DEFAULT_MAX_CACHED_PER_BUCKET",
    "DEFAULT_MAX_CAPACITY",
    "DEFAULT_MIN_CAPACITY",
    "ENVIRONMENT_KEYS",
    "DebugLevel",
    "Settings",
    "resolve_settings",
]

DebugLevel = Literal["off", "checks", "strict"]
DEBUG_LEVELS: tuple[DebugLevel, ...] = ("off", "checks", "strict")
CONF_VARIABLE = "BUCKETPOOL_CONF"
DEBUG_VARIABLE = "BUCKETPOOL_DEBUG"

#: 64 MiB: sixteen in-flight triples of 131,072 descriptors (a large KV-offload step) fit.
DEFAULT_MAX_CACHED_BYTES = 64 << 20
#: Enough for a worker with 16 copies in flight plus the step being built, twice over.
DEFAULT_MAX_CACHED_PER_BUCKET = 32
#: A bucket unused for this many acquires of the pool gives its cached buffers back.
DEFAULT_IDLE_TRIM_ACQUIRES = 1024

#: The settings ``BUCKETPOOL_CONF`` may set; dtype, device and pin_memory are arguments only.
ENVIRONMENT_KEYS = (
    "min_capacity",
    "max_capacity",
    "max_cached_bytes",
    "max_cached_per_bucket",
    "idle_trim_acquires",
    "debug",
    "trace",
)

_BYTES_PER_TRIPLE_ENTRY = 3 * 8  # three 8-byte descriptors per entry
# Where the physical memory cannot be read (no sysconf, as on Windows): 1 TiB.
_FALLBACK_MEMORY = 1 << 40


def _physical_memory() -> int:
    """The machine's physical memory in bytes, or a 1 TiB fallback where it is unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _FALLBACK_MEMORY
    return total if total > 0 else _FALLBACK_MEMORY


# -- converters and validators (construction only, never on the hot path) ------------------


def _plain_int(value: SupportsIndex) -> int:
    """Return *value* as a plain int; leave a bool or non-integer for the validator to name."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value  # type: ignore[return-value]


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int (or a numpy integer), not {type(value).__name__} "
            f"({name}={value!r})"
        )
    return value


def _check_non_negative(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    if _integer(attribute.name, value) < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {attribute.name}={value}")


def _check_min_capacity(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_power_of_two(attribute.name, value)


def _check_max_capacity(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    capacity = check_power_of_two(attribute.name, value)
    memory = _physical_memory()
    if capacity * _BYTES_PER_TRIPLE_ENTRY > memory:
        raise ValueError(
            f"max_capacity={capacity} is too large: one triple of that capacity takes "
            f"{capacity * _BYTES_PER_TRIPLE_ENTRY} bytes, more than this machine's "
            f"{memory} bytes of memory; use at most "
            f"max_capacity={1 << (memory // _BYTES_PER_TRIPLE_ENTRY).bit_length() - 1}"
        )


def _check_dtype(_: object, attribute: attrs.Attribute[torch.dtype], value: object) -> None:
    if value is not torch.int64 and value is not torch.uint64:
        raise TypeError(
            f"dtype must be torch.int64 or torch.uint64 (XPU's batched copy), got {value!r}"
        )


def _to_device(value: str | torch.device) -> torch.device:
    """Convert a device string such as ``"cpu"``; anything else is left for the validator."""
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError as error:
            raise ValueError(
                f"device={value!r} is not a torch device ({error}); use 'cpu'"
            ) from None
    return value


def _check_device(_: object, attribute: attrs.Attribute[torch.device], value: object) -> None:
    if not isinstance(value, torch.device):
        raise TypeError(f"device must be a torch.device or a string such as 'cpu', got {value!r}")
    if value.type != "cpu":
        raise ValueError(
            f"device must be the CPU, got device={str(value)!r}: swap_blocks_batch reads its "
            "descriptors from host memory; use device='cpu', and pin_memory=True for fast "
            "non-blocking uploads to the accelerator"
        )


def _check_bool(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"{attribute.name} must be True or False, not {type(value).__name__} "
            f"({attribute.name}={value!r})"
        )


def _check_pin_memory(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    _check_bool(instance, attribute, value)
    if value:
        try:
            torch.empty(1, device="cpu", pin_memory=True)
        except RuntimeError as error:
            raise RuntimeError(
                "pin_memory=True needs an accelerator (CUDA, ROCm, XPU, ...) that can pin "
                f"host memory, and none can here ({error}); use pin_memory=False"
            ) from None


def _check_debug(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in DEBUG_LEVELS:
        raise ValueError(
            f"debug={value!r} is not a debug level; use one of {', '.join(DEBUG_LEVELS)}"
        )


# -- the record ----------------------------------------------------------------------------


@typing.final
@attrs.frozen
class Settings:
    """The validated settings of one pool; each is checked when the record is made.

    Integer settings take anything `operator.index` takes (numpy integers too, not bools)
    and are stored as plain ints. Immutable, so safe to share between threads.

    Attributes:
        dtype: `torch.int64` (default) or `torch.uint64` (XPU's batched copy).
        device: the CPU: descriptors are read by the host (a string such as ``"cpu"`` is
            converted).
        pin_memory: page-locked buffers for non-blocking uploads; needs an accelerator.
        min_capacity: the smallest bucket, a power of two (default 16).
        max_capacity: the largest bucket, a power of two >= *min_capacity* (default 2**24)
            whose triple (24 bytes per entry) fits in the machine's physical memory.
        max_cached_bytes: the most bytes of released buffers kept (>= 0, default 64 MiB).
        max_cached_per_bucket: the most released buffers kept per bucket (>= 0, default 32).
        idle_trim_acquires: acquires after which an unused bucket's cache is freed (>= 0,
            default 1024).
        debug: ``"off"`` (default), ``"checks"`` or ``"strict"``.
        trace: record where each buffer was acquired (default False).

    Raises:
        TypeError: a setting of the wrong type (a bool or a float for an integer, another
            dtype).
        ValueError: a value out of range, a non-CPU device, or *min_capacity* above
            *max_capacity*.
        RuntimeError: *pin_memory* where nothing can pin memory.
    """

    dtype: torch.dtype = attrs.field(default=torch.int64, validator=_check_dtype)
    device: torch.device = attrs.field(
        default=torch.device("cpu"), converter=_to_device, validator=_check_device
    )
    pin_memory: bool = attrs.field(default=False, validator=_check_pin_memory)
    min_capacity: int = attrs.field(
        default=DEFAULT_MIN_CAPACITY, converter=_plain_int, validator=_check_min_capacity
    )
    max_capacity: int = attrs.field(
        default=DEFAULT_MAX_CAPACITY, converter=_plain_int, validator=_check_max_capacity
    )
    max_cached_bytes: int = attrs.field(
        default=DEFAULT_MAX_CACHED_BYTES, converter=_plain_int, validator=_check_non_negative
    )
    max_cached_per_bucket: int = attrs.field(
        default=DEFAULT_MAX_CACHED_PER_BUCKET,
        converter=_plain_int,
        validator=_check_non_negative,
    )
    idle_trim_acquires: int = attrs.field(
        default=DEFAULT_IDLE_TRIM_ACQUIRES, converter=_plain_int, validator=_check_non_negative
    )
    debug: DebugLevel = attrs.field(default="off", validator=_check_debug)
    trace: bool = attrs.field(default=False, validator=_check_bool)

    def __attrs_post_init__(self) -> None:
        if self.min_capacity > self.max_capacity:
            raise ValueError(
                f"min_capacity={self.min_capacity} is above max_capacity={self.max_capacity}; "
                "make min_capacity <= max_capacity"
            )


_FIELDS = attrs.fields_dict(Settings)


# -- resolving: arguments, then BUCKETPOOL_DEBUG, then BUCKETPOOL_CONF, then defaults --------


def resolve_settings(
    explicit: Mapping[str, object], environ: Mapping[str, str] = os.environ
) -> Settings:
    """Merge explicit arguments, the environment and the defaults into checked `Settings`.

    Explicit arguments that are not `None` win over ``BUCKETPOOL_DEBUG``, which wins over
    ``BUCKETPOOL_CONF`` (comma-separated ``key=value`` items), which wins over the defaults.
    A value that a higher source overrides (an explicit argument; ``BUCKETPOOL_DEBUG`` for
    a ``debug`` item of ``BUCKETPOOL_CONF``) is not even parsed, so a bad one there cannot
    fail the call. ``BUCKETPOOL_CONF`` may set `ENVIRONMENT_KEYS`; integers
    are written as Python literals (``1024``, ``0x400``, ``1_024``), booleans as ``true`` or
    ``false`` (any case), and each key at most once.

    Args:
        explicit: setting name -> argument; `None` means not given.
        environ: the environment to read (`os.environ` by default, read at each call).

    Returns:
        The settings, each validated.

    Raises:
        TypeError: an unknown argument name, or an argument of the wrong type.
        ValueError: a malformed, unknown or duplicate ``BUCKETPOOL_CONF`` item, or a value
            out of range; the message names the argument or variable and the value.
        RuntimeError: ``pin_memory=True`` where nothing can pin memory.
    """
    given = {key: value for key, value in explicit.items() if value is not None}
    for key in given:
        if key not in _FIELDS:
            raise TypeError(f"unknown setting {key!r}; settings: {', '.join(_FIELDS)}")
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    level = environ.get(DEBUG_VARIABLE, "").strip()
    if level and "debug" not in given:
        where = f"{DEBUG_VARIABLE}={level!r}"
        values["debug"], sources["debug"] = _parse("debug", level, where), where
    for key, raw in _conf_items(environ.get(CONF_VARIABLE, "")).items():
        if key not in given and key not in values:
            where = f"{CONF_VARIABLE} item {key}={raw!r}"
            values[key], sources[key] = _parse(key, raw, where), where
    for key, value in given.items():
        values[key], sources[key] = value, f"argument {key}={value!r}"
    for key, value in values.items():
        _check(key, value, sources[key])
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValueError as error:  # the only check across fields: min <= max capacity
        where = " and ".join(
            sources.get(key, f"default {key}") for key in ("min_capacity", "max_capacity")
        )
        raise ValueError(f"{where}: {error}") from None


def _conf_items(text: str) -> dict[str, str]:
    """Split ``BUCKETPOOL_CONF`` into key -> raw value, checking keys but not values."""
    items: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, raw = (part.strip() for part in item.partition("="))
        where = f"{CONF_VARIABLE} item {item.strip()!r}"
        if not sep:
            raise ValueError(f"{where} is not key=value; write e.g. max_cached_bytes=67108864")
        if key not in ENVIRONMENT_KEYS:
            raise ValueError(
                f"{where}: unknown key {key!r}; known keys: {', '.join(ENVIRONMENT_KEYS)}"
            )
        if key in items:
            raise ValueError(
                f"{where}: duplicate key {key!r} (already {key}={items[key]!r}); set each key once"
            )
        items[key] = raw
    return items


def _parse(key: str, raw: str, where: str) -> object:
    if key == "debug":
        level = raw.lower()
        if level not in DEBUG_LEVELS:
            raise ValueError(f"{where}: unknown debug level; use one of {', '.join(DEBUG_LEVELS)}")
        return level
    if key == "trace":
        if raw.lower() == "true":
            return True
        if raw.lower() == "false":
            return False
        raise ValueError(f"{where} is not a boolean; write true or false")
    try:
        if not raw.isascii():  # int() would take other scripts' digits: not a Python literal
            raise ValueError(raw)
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{where} is not an integer; write e.g. {key}=1024") from None


def _check(key: str, value: object, where: str) -> None:
    """Run one setting's converter and validator, naming where a rejected value came from."""
    field = _FIELDS[key]
    converter = field.converter
    try:
        converted = value if converter is None else converter(value)  # type: ignore[operator]
        if field.validator is not None:
            field.validator(None, field, converted)
    except (TypeError, ValueError, RuntimeError) as error:
        raise type(error)(f"{where}: {error}") from None
