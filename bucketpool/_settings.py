"""A pool's settings, resolved from arguments and environment, and the counts it checks."""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from contextlib import suppress
from typing import Any, Literal, SupportsIndex, cast, final

import attrs
import torch
from attrs import field

__all__ = [
    "DEBUG_LEVELS",
    "DebugLevel",
    "Settings",
    "as_index",
    "bucket_capacity",
    "check_count",
    "resolve_settings",
]

DebugLevel = Literal["off", "checks", "strict"]
DEBUG_LEVELS: tuple[DebugLevel, ...] = ("off", "checks", "strict")
CONF_VARIABLE = "BUCKETPOOL_CONF"
DEBUG_VARIABLE = "BUCKETPOOL_DEBUG"
DEFAULT_MIN_CAPACITY = 16  # a 384-byte triple: smaller buffers cost the same to allocate
DEFAULT_MAX_CAPACITY = 1 << 24  # 384 MiB a triple: stops an accidental huge request
_TRIPLE_ENTRY_BYTES = 3 * 8
_CPU = torch.device("cpu")


def as_index(value: object, what: str, kind: str = "an integer", hint: str = "") -> int:
    """``operator.index(value)``, refusing bools: TypeError ``{what} must be {kind}, ...``."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    advice = f"; {hint}" if hint else ""
    raise TypeError(f"{what} must be {kind}, not {type(value).__name__} ({value!r}){advice}")


def check_count(n: object, max_capacity: int = DEFAULT_MAX_CAPACITY, op: str = "acquire") -> int:
    """Return *n* as an int if it is a descriptor count from 0 to *max_capacity*."""
    hint = "pass len(...) of the copies or an int"
    count = as_index(n, f"{op}: n", "an integer count of descriptors", hint)
    if count < 0:
        raise ValueError(
            f"{op}: n must be >= 0, got {count}; pass the number of descriptors to copy"
        )
    if count > max_capacity:
        raise ValueError(
            f"{op}: n={count} is above the pool's max_capacity={max_capacity}; split the step "
            f"into batches of at most {max_capacity} copies or raise max_capacity"
        )
    return count


def check_non_negative(value: object, what: str) -> int:
    number = as_index(value, what)
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number


def bucket_capacity(n: SupportsIndex) -> int:
    """Return *n*'s bucket in a default pool: the smallest power of two >= *n*, at least 16.

    Raises:
        TypeError: *n* is a `bool` or not an integer.
        ValueError: *n* is negative or above the default maximum capacity (2**24).
    """
    count = check_count(n, op="bucket_capacity")
    return max(DEFAULT_MIN_CAPACITY, 1 << (count - 1).bit_length() if count else 1)


def _int(value: SupportsIndex) -> int:
    """*value* as an int; a bool or non-integer is left for the validator to name."""
    with suppress(TypeError):
        return value if isinstance(value, bool) else operator.index(value)
    return value  # type: ignore[return-value]


def _wrong_type(name: str, kind: str, value: object) -> TypeError:
    return TypeError(f"{name} must be {kind}, not {type(value).__name__} ({name}={value!r})")


def _non_negative(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(attribute.name, "an int (or a numpy integer)", value)
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {attribute.name}={value}")


def _power_of_two(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    name = attribute.name
    number = as_index(value, name, "a power-of-two int")
    if number < 1 or number & (number - 1):
        low = 1 << (number.bit_length() - 1) if number > 1 else 0
        advice = f"the nearest are {low} and {2 * low}" if low else "use 1 or more"
        raise ValueError(f"{name} must be a power of two >= 1, got {number}; {advice}")
    if name == "max_capacity":
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # unknown (no sysconf): 1 TiB
            memory = 1 << 40
        if number * _TRIPLE_ENTRY_BYTES > memory > 0:
            most = 1 << (memory // _TRIPLE_ENTRY_BYTES).bit_length() - 1
            raise ValueError(
                f"max_capacity={number} is too large: one triple of that capacity takes "
                f"{number * _TRIPLE_ENTRY_BYTES} bytes, more than this machine's {memory} "
                f"bytes of memory; use at most max_capacity={most}"
            )


def _check_choice(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Check dtype, device, debug, pin_memory or trace, each one of a few values."""
    name = attribute.name
    if name == "dtype" and value is not torch.int64 and value is not torch.uint64:
        raise TypeError(
            f"dtype must be torch.int64 or torch.uint64 (XPU's batched copy), got {value!r}"
        )
    if name == "device" and not isinstance(value, torch.device):
        raise TypeError(f"device must be a torch.device or a string such as 'cpu', got {value!r}")
    if name == "device" and isinstance(value, torch.device) and value.type != "cpu":
        raise ValueError(
            f"device must be the CPU, got device={str(value)!r}: swap_blocks_batch reads its "
            "descriptors from host memory; use device='cpu', and pin_memory=True for fast "
            "non-blocking uploads to the accelerator"
        )
    if name == "debug" and value not in DEBUG_LEVELS:
        raise ValueError(
            f"debug={value!r} is not a debug level; use one of {', '.join(DEBUG_LEVELS)}"
        )
    if name in ("pin_memory", "trace") and not isinstance(value, bool):
        raise _wrong_type(name, "True or False", value)
    if name == "pin_memory" and value:
        try:
            torch.empty(1, device="cpu", pin_memory=True)
        except RuntimeError as error:
            raise RuntimeError(
                "pin_memory=True needs an accelerator (CUDA, ROCm, XPU, ...) that can pin "
                f"host memory, and none can here ({error}); use pin_memory=False"
            ) from None


def _to_device(value: str | torch.device) -> torch.device:
    try:
        return torch.device(value) if isinstance(value, str) else value
    except RuntimeError as error:
        raise ValueError(f"device={value!r} is not a torch device ({error}); use 'cpu'") from None


@final
@attrs.frozen
class Settings:
    """The validated, immutable settings of one pool; integers are stored as plain ints.

    Attributes:
        dtype: `torch.int64` (default) or `torch.uint64` (XPU's batched copy).
        device: the CPU, where the host reads descriptors (``"cpu"`` is converted).
        pin_memory: page-locked buffers for non-blocking uploads; needs an accelerator.
        min_capacity: the smallest bucket, a power of two (default 16).
        max_capacity: the largest bucket, a power of two >= min_capacity (default 2**24).
        max_cached_bytes: the most bytes of idle buffers kept (default 64 MiB).
        max_cached_per_bucket: the most idle buffers kept per bucket (default 32).
        idle_trim_acquires: acquires after which an idle bucket's cache is freed (1024; 0 never).
        debug: ``"off"`` (default), ``"checks"`` or ``"strict"``.
        trace: record where each buffer was acquired (default False).

    Raises:
        TypeError: a setting of the wrong type (a bool or float for an integer, another dtype).
        ValueError: a value out of range, a non-CPU device, or min_capacity > max_capacity.
        RuntimeError: *pin_memory* where nothing can pin memory.
    """

    dtype: torch.dtype = field(default=torch.int64, validator=_check_choice)
    device: torch.device = field(default=_CPU, converter=_to_device, validator=_check_choice)
    pin_memory: bool = field(default=False, validator=_check_choice)
    min_capacity: int = field(default=DEFAULT_MIN_CAPACITY, converter=_int, validator=_power_of_two)
    max_capacity: int = field(default=DEFAULT_MAX_CAPACITY, converter=_int, validator=_power_of_two)
    max_cached_bytes: int = field(default=64 << 20, converter=_int, validator=_non_negative)
    max_cached_per_bucket: int = field(default=32, converter=_int, validator=_non_negative)
    idle_trim_acquires: int = field(default=1024, converter=_int, validator=_non_negative)
    debug: DebugLevel = field(default="off", validator=_check_choice)
    trace: bool = field(default=False, validator=_check_choice)

    def __attrs_post_init__(self) -> None:
        if self.min_capacity > self.max_capacity:
            raise ValueError(
                f"min_capacity={self.min_capacity} is above max_capacity={self.max_capacity}; "
                "make min_capacity <= max_capacity"
            )


_FIELDS = attrs.fields_dict(Settings)
ENVIRONMENT_KEYS = tuple(_FIELDS)[3:]  # what BUCKETPOOL_CONF may set: not dtype, device, pin_memory
DEFAULT_MAX_CACHED_BYTES = cast(int, _FIELDS["max_cached_bytes"].default)
DEFAULT_MAX_CACHED_PER_BUCKET = cast(int, _FIELDS["max_cached_per_bucket"].default)
DEFAULT_IDLE_TRIM_ACQUIRES = cast(int, _FIELDS["idle_trim_acquires"].default)


def resolve_settings(
    explicit: Mapping[str, object], environ: Mapping[str, str] = os.environ
) -> Settings:
    """Merge arguments (not None) over BUCKETPOOL_DEBUG, over BUCKETPOOL_CONF, over defaults."""
    given = {key: value for key, value in explicit.items() if value is not None}
    for key in given:
        if key not in _FIELDS:
            raise TypeError(f"unknown setting {key!r}; settings: {', '.join(_FIELDS)}")
    found: dict[str, tuple[object, str]] = {}  # key -> (value, where it came from)
    level = environ.get(DEBUG_VARIABLE, "").strip()
    if level and "debug" not in given:
        where = f"{DEBUG_VARIABLE}={level!r}"
        found["debug"] = (_parse("debug", level, where), where)
    for key, raw in _conf_items(environ.get(CONF_VARIABLE, "")).items():
        if key not in given and key not in found:
            where = f"{CONF_VARIABLE} item {key}={raw!r}"
            found[key] = (_parse(key, raw, where), where)
    found.update((key, (value, f"argument {key}={value!r}")) for key, value in given.items())
    for key, (value, where) in found.items():
        spec = _FIELDS[key]
        try:
            converted = value if spec.converter is None else spec.converter(value)  # type: ignore[operator]
            spec.validator(None, spec, converted)  # type: ignore[misc]
        except (TypeError, ValueError, RuntimeError) as error:
            raise type(error)(f"{where}: {error}") from None
    try:
        return Settings(**{key: value for key, (value, _) in found.items()})  # type: ignore[arg-type]
    except ValueError as error:  # the only check across fields: min <= max capacity
        names = ("min_capacity", "max_capacity")
        where = " and ".join(found[key][1] if key in found else f"default {key}" for key in names)
        raise ValueError(f"{where}: {error}") from None


def _conf_items(text: str) -> dict[str, str]:
    """Split ``BUCKETPOOL_CONF`` into key -> raw value, checking keys but not values."""
    items: dict[str, str] = {}
    for item in filter(str.strip, text.split(",")):
        key, sep, raw = (part.strip() for part in item.partition("="))
        where = f"{CONF_VARIABLE} item {item.strip()!r}"
        if not sep:
            raise ValueError(f"{where} is not key=value; write e.g. max_cached_bytes=67108864")
        if key not in ENVIRONMENT_KEYS:
            known = ", ".join(ENVIRONMENT_KEYS)
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {known}")
        if key in items:
            raise ValueError(
                f"{where}: duplicate key {key!r} (already {key}={items[key]!r}); set each key once"
            )
        items[key] = raw
    return items


def _parse(key: str, raw: str, where: str) -> object:
    value = raw.lower()
    if key == "debug" and value not in DEBUG_LEVELS:
        raise ValueError(f"{where}: unknown debug level; use one of {', '.join(DEBUG_LEVELS)}")
    if key == "trace" and value not in ("true", "false"):
        raise ValueError(f"{where} is not a boolean; write true or false")
    if key in ("debug", "trace"):
        return value == "true" if key == "trace" else value
    if raw.isascii():  # int() would take other scripts' digits: not a Python literal
        with suppress(ValueError):
            return int(raw, 0)
    raise ValueError(f"{where} is not an integer; write e.g. {key}=1024")
