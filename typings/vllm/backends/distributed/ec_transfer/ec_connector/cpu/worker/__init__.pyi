# The EC CPU worker package at its newer, canonical path.  It imports the two names below from
# its descriptor_buffers submodule, which is why bucketpool.vllm.install() rebinds them here
# too; the rest of the module (ECCPUWorker, Transfer, ...) is not stubbed.
from vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    DescriptorBufferPool as DescriptorBufferPool,
)
from vllm.backends.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    DescriptorBuffers as DescriptorBuffers,
)
