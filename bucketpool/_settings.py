"""Pool settings: built-in defaults, ``BUCKETPOOL_CONF``/``BUCKETPOOL_DEBUG``, validation."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from typing import Literal

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


@typing.final
@attrs.frozen
class Settings:
    """Resolved, validated settings of one pool."""

    min_capacity: int = DEFAULT_MIN_CAPACITY
    max_capacity: int = DEFAULT_MAX_CAPACITY
    max_cached_bytes: int = DEFAULT_MAX_CACHED_BYTES
    max_cached_per_bucket: int = DEFAULT_MAX_CACHED_PER_BUCKET
    idle_trim_acquires: int = DEFAULT_IDLE_TRIM_ACQUIRES
    debug: DebugLevel = "off"
    trace: bool = False
    dtype: torch.dtype = torch.int64
    device: torch.device = torch.device("cpu")
    pin_memory: bool = False


_INT_KEYS = (
    "min_capacity",
    "max_capacity",
    "max_cached_bytes",
    "max_cached_per_bucket",
    "idle_trim_acquires",
)
_KEYS = (*_INT_KEYS, "debug", "trace")


def resolve_settings(
    explicit: Mapping[str, object], environ: Mapping[str, str] = os.environ
) -> Settings:
    """Merge built-in defaults, the environment and explicit arguments, then validate.

    Explicit arguments that are not `None` win over ``BUCKETPOOL_DEBUG``, which wins over
    ``BUCKETPOOL_CONF``, which wins over the built-in defaults.

    Raises:
        ValueError: an unknown key or a bad value; the message says where it came from.
    """
    merged: dict[str, tuple[object, str]] = {}  # key -> (value, where it came from)
    for key, value in _parse_conf(environ.get(CONF_VARIABLE, "")).items():
        merged[key] = (value, f"{CONF_VARIABLE} {key}={value!r}")
    level = environ.get(DEBUG_VARIABLE, "").strip()
    if level:
        where = f"{DEBUG_VARIABLE}={level!r}"
        merged["debug"] = (_parse_debug(level, where), where)
    for key, value in explicit.items():
        if value is not None:
            merged[key] = (value, f"argument {key}={value!r}")
    settings = _validate(merged)
    extra = {
        k: explicit[k] for k in ("dtype", "device", "pin_memory") if explicit.get(k) is not None
    }
    return attrs.evolve(settings, **extra)  # type: ignore[arg-type]


def _parse_conf(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, raw = (part.strip() for part in item.partition("="))
        where = f"{CONF_VARIABLE} item {item.strip()!r}"
        if not sep:
            raise ValueError(f"{where} is not key=value; write e.g. max_cached_bytes=67108864")
        if key not in _KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {', '.join(_KEYS)}")
        if key == "debug":
            values[key] = _parse_debug(raw, where)
        elif key == "trace":
            values[key] = _parse_bool(raw, where)
        else:
            values[key] = _parse_int(raw, where)
    return values


def _parse_int(raw: str, where: str) -> int:
    try:
        return int(raw.replace("_", ""), 0)
    except ValueError:
        raise ValueError(f"{where}: {raw!r} is not an integer") from None


def _parse_bool(raw: str, where: str) -> bool:
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{where}: {raw!r} is not a boolean; use true or false")


def _parse_debug(raw: str, where: str) -> DebugLevel:
    for level in DEBUG_LEVELS:
        if raw.lower() == level:
            return level
    raise ValueError(f"{where}: unknown debug level; valid levels: {', '.join(DEBUG_LEVELS)}")


def _validate(values: Mapping[str, tuple[object, str]]) -> Settings:
    """Check each merged value; an error names the value and where it came from."""
    defaults = Settings()
    checked: dict[str, object] = {}
    for key in _KEYS:
        value, where = values.get(key, (getattr(defaults, key), "default"))
        try:
            checked[key] = _check(key, value)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    if checked["min_capacity"] > checked["max_capacity"]:  # type: ignore[operator]
        raise ValueError(
            f"min_capacity={checked['min_capacity']} is above "
            f"max_capacity={checked['max_capacity']}; make min_capacity <= max_capacity"
        )
    return Settings(**checked)  # type: ignore[arg-type]


def _check(key: str, value: object) -> object:
    if key in ("min_capacity", "max_capacity"):
        return check_power_of_two(key, value)
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
        return value
    if key == "debug":
        if value not in DEBUG_LEVELS:
            raise ValueError(
                f"unknown debug level {value!r}; valid levels: {', '.join(DEBUG_LEVELS)}"
            )
        return value
    if not isinstance(value, bool):
        raise ValueError(f"trace must be a bool, got {value!r}")
    return value
