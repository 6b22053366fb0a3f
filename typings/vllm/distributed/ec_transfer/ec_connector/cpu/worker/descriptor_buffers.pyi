# vLLM's pool of swap_blocks_batch descriptor buffers, in both of the shapes it has had.
#
# DescriptorBuffers was first a NamedTuple of three tensors (src_ptrs, dst_ptrs, sizes); later
# versions add numpy aliases of the same memory (src_np, dst_np, sizes_np) and add_copies().
# Which shape an installation has is known only at run time, from DescriptorBuffers._fields,
# so the module attribute is typed as either class and the pool takes and returns either tuple:
# the three tensor fields are always safe to use, the six-field members only after narrowing.
# Both classes below are names for the type checker only; neither exists in vLLM.
#
# The tensors are 1-D CPU tensors of one length; their dtype is int64, or uint64 when vLLM's
# platform is XPU (later versions keep it in a private module constant, _PTR_DTYPE, which
# bucketpool does not read).
from typing import NamedTuple, TypeAlias, type_check_only

import numpy as np
import numpy.typing as npt
import torch

_DescriptorArray: TypeAlias = npt.NDArray[np.int64] | npt.NDArray[np.uint64]
_IntegerArray: TypeAlias = npt.NDArray[np.integer]

@type_check_only
class _TensorDescriptorBuffers(NamedTuple):
    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor

@type_check_only
class _AliasedDescriptorBuffers(NamedTuple):
    src_ptrs: torch.Tensor
    dst_ptrs: torch.Tensor
    sizes: torch.Tensor
    src_np: _DescriptorArray
    dst_np: _DescriptorArray
    sizes_np: _DescriptorArray
    # Writes len(sources) copies into entries [first, first + len(sources)).
    def add_copies(
        self,
        first: int,
        sources: _IntegerArray,
        destinations: _IntegerArray,
        byte_counts: _IntegerArray,
    ) -> None: ...

_AnyDescriptorBuffers: TypeAlias = _TensorDescriptorBuffers | _AliasedDescriptorBuffers

DescriptorBuffers: type[_TensorDescriptorBuffers] | type[_AliasedDescriptorBuffers]

class DescriptorBufferPool:
    def __init__(self) -> None: ...
    # Returns buffers of at least n entries (the last released ones if they are big enough).
    def acquire(self, n: int) -> _AnyDescriptorBuffers: ...
    def release(self, bufs: _AnyDescriptorBuffers) -> None: ...
