"""A pool's settings, resolved from arguments and environment, and the counts it checks."""

from __future__ import annotations

import operator
import os
import typing
from collections.abc import Mapping
from typing import Literal, SupportsIndex

import attrs
import torch

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
#: The settings ``BUCKETPOOL_CONF`` may set; dtype, device and pin_memory are arguments only.
ENVIRONMENT_KEYS = (
    *("min_capacity", "max_capacity", "max_cached_bytes", "max_cached_per_bucket"),
    *("idle_trim_acquires", "debug", "trace"),
)
#: Smallest bucket: 16 entries (a 384-byte triple); smaller buffers cost the same to allocate.
DEFAULT_MIN_CAPACITY = 16
#: Largest bucket: 2**24 entries (384 MiB per triple), which stops an accidental huge request.
DEFAULT_MAX_CAPACITY = 1 << 24
#: 64 MiB: sixteen in-flight triples of 131,072 descriptors (a large KV-offload step).
DEFAULT_MAX_CACHED_BYTES = 64 << 20
#: A worker with 16 copies in flight plus the step being built, twice over.
DEFAULT_MAX_CACHED_PER_BUCKET = 32
DEFAULT_IDLE_TRIM_ACQUIRES = 1024
_TRIPLE_ENTRY_BYTES = 3 * 8


def as_index(value: object, what: str, kind: str = "an integer", hint: str = "") -> int:
    """``operator.index(value)``: ints, numpy integers, anything with ``__index__``.

    Raises:
        TypeError: *value* is a `bool` or not an integer; the message says ``{what} must be
            {kind}``, names the value and adds *hint* when given.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    advice = f"; {hint}" if hint else ""
    raise TypeError(f"{what} must be {kind}, not {type(value).__name__} ({value!r}){advice}")


def check_count(n: object, max_capacity: int = DEFAULT_MAX_CAPACITY, op: str = "acquire") -> int:
    """Return *n* as an int if it is a descriptor count from 0 to *max_capacity*.

    Raises:
        TypeError: *n* is a `bool` or not an integer.
        ValueError: *n* is negative or above *max_capacity*.
    """
    count = as_index(
        n, f"{op}: n", "an integer count of descriptors", "pass len(...) of the copies or an int"
    )
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
    """Return *value* as an int if it is an integer >= 0 (TypeError, ValueError otherwise)."""
    number = as_index(value, what)
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number


def bucket_capacity(n: SupportsIndex) -> int:
    """Return the capacity of the bucket that serves *n* entries in a default pool.

    The smallest power of two >= *n*, never below 16.  A pool made with other settings
    answers with `BucketPool.bucket_capacity`.

    Raises:
        TypeError: *n* is a `bool` or not an integer.
        ValueError: *n* is negative or above the default maximum capacity (2**24).
    """
    count = check_count(n, op="bucket_capacity")
    return max(DEFAULT_MIN_CAPACITY, 1 << (count - 1).bit_length() if count else 1)


# -- validators (construction only) ---------------------------------------------------------


def _plain_int(value: SupportsIndex) -> int:
    """*value* as an int; a bool or non-integer is left for the validator to name."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value  # type: ignore[return-value]


def _non_negative(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    name = attribute.name
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int (or a numpy integer), not {type(value).__name__} "
            f"({name}={value!r})"
        )
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {name}={value}")


def _power_of_two(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    name = attribute.name
    number = as_index(value, name, "a power-of-two int")
    if number < 1:
        raise ValueError(f"{name} must be a power of two >= 1, got {number}; use 1 or more")
    if number & (number - 1):
        low = 1 << (number.bit_length() - 1)
        raise ValueError(
            f"{name} must be a power of two >= 1, got {number}; the nearest are {low} and {2 * low}"
        )
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


def _check_dtype(_: object, attribute: attrs.Attribute[torch.dtype], value: object) -> None:
    if value is not torch.int64 and value is not torch.uint64:
        raise TypeError(
            f"dtype must be torch.int64 or torch.uint64 (XPU's batched copy), got {value!r}"
        )


def _to_device(value: str | torch.device) -> torch.device:
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
    if attribute.name == "pin_memory" and value:
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


def _count(default: int, validator: typing.Any = _non_negative) -> typing.Any:
    return attrs.field(default=default, converter=_plain_int, validator=validator)


@typing.final
@attrs.frozen
class Settings:
    """The validated settings of one pool; each is checked when the record is made.

    Integer settings take anything `operator.index` takes (numpy integers too, not bools)
    and are stored as plain ints.  Immutable, so safe to share between threads.

    Attributes:
        dtype: `torch.int64` (default) or `torch.uint64` (XPU's batched copy).
        device: the CPU: descriptors are read by the host (``"cpu"`` is converted).
        pin_memory: page-locked buffers for non-blocking uploads; needs an accelerator.
        min_capacity: the smallest bucket, a power of two (default 16).
        max_capacity: the largest bucket, a power of two >= *min_capacity* (default 2**24)
            whose triple (24 bytes per entry) fits in the machine's physical memory.
        max_cached_bytes: the most bytes of idle buffers kept (>= 0, default 64 MiB).
        max_cached_per_bucket: the most idle buffers kept per bucket (>= 0, default 32).
        idle_trim_acquires: acquires after which an unused bucket's cache is freed (>= 0,
            default 1024; 0 never).
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
    pin_memory: bool = attrs.field(default=False, validator=_check_bool)
    min_capacity: int = _count(DEFAULT_MIN_CAPACITY, _power_of_two)
    max_capacity: int = _count(DEFAULT_MAX_CAPACITY, _power_of_two)
    max_cached_bytes: int = _count(DEFAULT_MAX_CACHED_BYTES)
    max_cached_per_bucket: int = _count(DEFAULT_MAX_CACHED_PER_BUCKET)
    idle_trim_acquires: int = _count(DEFAULT_IDLE_TRIM_ACQUIRES)
    debug: DebugLevel = attrs.field(default="off", validator=_check_debug)
    trace: bool = attrs.field(default=False, validator=_check_bool)

    def __attrs_post_init__(self) -> None:
        if self.min_capacity > self.max_capacity:
            raise ValueError(
                f"min_capacity={self.min_capacity} is above max_capacity={self.max_capacity}; "
                "make min_capacity <= max_capacity"
            )


_FIELDS = attrs.fields_dict(Settings)


def resolve_settings(
    explicit: Mapping[str, object], environ: Mapping[str, str] = os.environ
) -> Settings:
    """Merge explicit arguments, the environment and the defaults into checked `Settings`.

    Arguments that are not None win over ``BUCKETPOOL_DEBUG``, which wins over
    ``BUCKETPOOL_CONF`` (comma-separated ``key=value`` items of `ENVIRONMENT_KEYS`, integers
    as Python literals, booleans as true or false, each key once), which wins over the
    defaults.  A value that a higher source overrides is not parsed, so a bad one there
    cannot fail the call.  Errors name the argument or variable and the value.

    Raises:
        TypeError: an unknown argument name, or an argument of the wrong type.
        ValueError: a malformed, unknown or duplicate ``BUCKETPOOL_CONF`` item, or a value
            out of range.
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
        field = _FIELDS[key]
        try:
            converted = value if field.converter is None else field.converter(value)  # type: ignore[operator]
            field.validator(None, field, converted)  # type: ignore[misc]
        except (TypeError, ValueError, RuntimeError) as error:
            raise type(error)(f"{sources[key]}: {error}") from None
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValueError as error:  # the only check across fields: min <= max capacity
        names = ("min_capacity", "max_capacity")
        where = " and ".join(sources.get(key, f"default {key}") for key in names)
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
        if raw.lower() not in DEBUG_LEVELS:
            raise ValueError(f"{where}: unknown debug level; use one of {', '.join(DEBUG_LEVELS)}")
        return raw.lower()
    if key == "trace":
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ValueError(f"{where} is not a boolean; write true or false")
    try:
        if not raw.isascii():  # int() would take other scripts' digits: not a Python literal
            raise ValueError(raw)
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{where} is not an integer; write e.g. {key}=1024") from None
