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
from bucketpool._handle import BufferHandle, CompletionEvent, DescriptorBuffers
from bucketpool._pool import BucketPool
from bucketpool._stats import BucketStats, OutstandingBuffer, PoolStats, Stat

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
    "OutstandingBuffer",
    "PoolError",
    "PoolStats",
    "ReleaseError",
    "Stat",
    "UseAfterReleaseError",
    "bucket_capacity",
]
