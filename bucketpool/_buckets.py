"""Power-of-two bucket arithmetic: pure integer functions, no torch."""

from __future__ import annotations

import operator
from typing import SupportsIndex

__all__ = [
    "DEFAULT_MAX_CAPACITY",
    "DEFAULT_MIN_CAPACITY",
    "bucket_capacity",
    "capacity_for",
    "check_count",
    "check_non_negative_count",
    "check_power_of_two",
]

#: Smallest bucket: 16 entries (a 384-byte triple); smaller buffers cost the same to allocate.
DEFAULT_MIN_CAPACITY = 16
#: Largest bucket: 2**24 entries (384 MiB per triple), which stops an accidental huge request.
DEFAULT_MAX_CAPACITY = 1 << 24


def as_index(value: object, what: str, kind: str = "an integer", hint: str = "") -> int:
    """Return ``operator.index(value)``: ints, numpy integers, anything with ``__index__``.

    Raises:
        TypeError: *value* is a `bool` or not an integer; the message says ``{what} must be
            {kind}``, names the value and adds *hint* (what to pass instead) when given.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    advice = f"; {hint}" if hint else ""
    raise TypeError(f"{what} must be {kind}, not {type(value).__name__} ({value!r}){advice}")


def check_count(
    n: object, max_capacity: int = DEFAULT_MAX_CAPACITY, operation: str = "acquire"
) -> int:
    """Return *n* as a Python int if it is a valid descriptor count.

    Args:
        n: anything `operator.index` accepts (int, numpy integer), except `bool`.
        max_capacity: the largest count accepted.
        operation: the call that was given *n*, named in the messages.

    Raises:
        TypeError: *n* is a `bool` or not an integer.
        ValueError: *n* is negative or above *max_capacity*.
    """
    count = as_index(
        n,
        f"{operation}: n",
        "an integer count of descriptors",
        "pass len(...) of the copies or an int",
    )
    if count < 0:
        raise ValueError(
            f"{operation}: n must be >= 0, got {count}; pass the number of descriptors to copy"
        )
    if count > max_capacity:
        raise ValueError(
            f"{operation}: n={count} is above the pool's max_capacity={max_capacity}; split "
            f"the step into batches of at most {max_capacity} copies or raise max_capacity"
        )
    return count


def check_non_negative_count(value: object, what: str) -> int:
    """Return *value* as a plain int if it is an integer >= 0; *what* names it in messages.

    Raises:
        TypeError: *value* is a `bool` or not an integer.
        ValueError: *value* is negative.
    """
    number = as_index(value, what)
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number


def check_power_of_two(name: str, value: object) -> int:
    """Return *value* as a plain int if it is a positive power of two.

    Args:
        name: the setting's name, for the messages.
        value: anything `operator.index` accepts (int, numpy integer), except `bool`.

    Raises:
        TypeError: *value* is a `bool` or not an integer.
        ValueError: *value* is not a power of two >= 1; the message gives the nearest.
    """
    number = as_index(value, name, "a power-of-two int")
    if number < 1:
        raise ValueError(f"{name} must be a power of two >= 1, got {number}; use 1 or more")
    if number & (number - 1):
        raise ValueError(
            f"{name} must be a power of two >= 1, got {number}; "
            f"the nearest are {_floor_pow2(number)} and {_ceil_pow2(number)}"
        )
    return number


def bucket_capacity(n: SupportsIndex) -> int:
    """Return the capacity of the bucket that serves a request for *n* entries.

    That is the smallest power of two >= *n*, never below the default minimum capacity
    (16).  A pool made with other settings answers with `BucketPool.bucket_capacity`.

    Raises:
        TypeError: *n* is a `bool` or not an integer.
        ValueError: *n* is negative or above the default maximum capacity (2**24).
    """
    return capacity_for(check_count(n, operation="bucket_capacity"), DEFAULT_MIN_CAPACITY)


def capacity_for(n: int, min_capacity: int) -> int:
    """Return the smallest power of two >= *n* and >= *min_capacity* (no validation)."""
    return min_capacity if n <= min_capacity else 1 << (n - 1).bit_length()


def _ceil_pow2(value: int) -> int:
    return 1 if value < 1 else 1 << (value - 1).bit_length()


def _floor_pow2(value: int) -> int:
    return 1 if value < 1 else 1 << (value.bit_length() - 1)
