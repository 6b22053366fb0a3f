# vllm._custom_ops: only the batched copy that descriptor buffers feed.
import torch

# Performs len(sizes) copies: sizes[i] bytes from address src_ptrs[i] to dst_ptrs[i].
# The three tensors are 1-D CPU tensors of one length, int64 on CUDA/ROCm and uint64 on XPU
# (whose build takes only the first three arguments).  Asynchronous: keep the tensors
# unchanged until an event recorded after the call has completed.
def swap_blocks_batch(
    src_ptrs: torch.Tensor,
    dst_ptrs: torch.Tensor,
    sizes: torch.Tensor,
    is_src_access_order_any: bool = False,
) -> None: ...
