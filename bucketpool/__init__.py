"""A pool of descriptor buffers for ``swap_blocks_batch``, in power-of-two buckets."""

from __future__ import annotations

import importlib.metadata

from bucketpool._errors import (
    CapacityError,
    InFlightReleaseWarning,
    InFlightWriteError,
    LeakWarning,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)
from bucketpool._handle import BufferHandle
from bucketpool._parking import orphaned_buffers
from bucketpool._pool import BucketPool
from bucketpool._settings import DebugLevel, Settings, bucket_capacity
from bucketpool._stats import BucketStats, OutstandingBuffer, PoolStats, Stat
from bucketpool._views import CompletionEvent, DescriptorBuffers

try:  # single-sourced: the version is the one in pyproject.toml, as installed
    __version__ = importlib.metadata.version("bucketpool")
except importlib.metadata.PackageNotFoundError:  # imported from a checkout, not installed
    __version__ = "0+unknown"

__all__ = [
    "BucketPool",
    "BucketStats",
    "BufferHandle",
    "CapacityError",
    "CompletionEvent",
    "DebugLevel",
    "DescriptorBuffers",
    "InFlightReleaseWarning",
    "InFlightWriteError",
    "LeakWarning",
    "OutstandingBuffer",
    "PoolError",
    "PoolStats",
    "ReleaseError",
    "Settings",
    "Stat",
    "UseAfterReleaseError",
    "bucket_capacity",
    "orphaned_buffers",
]
