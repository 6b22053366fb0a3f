"""A pool of descriptor buffers for ``swap_blocks_batch``, in power-of-two buckets."""

from __future__ import annotations

from bucketpool._buckets import bucket_capacity
from bucketpool._errors import (
    CapacityError,
    EscapedViewError,
    InFlightWriteError,
    LeakWarning,
    PoolError,
    ReleaseError,
    UseAfterReleaseError,
)
from bucketpool._pool import BucketPool, BufferHandle, CompletionEvent, DescriptorBuffers
from bucketpool._stats import BucketStats, PoolStats, Stat

__all__ = [
    "BucketPool",
    "BucketStats",
    "BufferHandle",
    "CapacityError",
    "CompletionEvent",
    "DescriptorBuffers",
    "EscapedViewError",
    "InFlightWriteError",
    "LeakWarning",
    "PoolError",
    "PoolStats",
    "ReleaseError",
    "Stat",
    "UseAfterReleaseError",
    "bucket_capacity",
]
