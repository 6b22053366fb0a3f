# The newer, canonical path of vLLM's descriptor_buffers module.  Where both paths exist the
# older one is an alias of this very module (the same object in sys.modules), so the types
# are shared rather than repeated.
from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    DescriptorBufferPool as DescriptorBufferPool,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    DescriptorBuffers as DescriptorBuffers,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    _AliasedDescriptorBuffers as _AliasedDescriptorBuffers,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    _AnyDescriptorBuffers as _AnyDescriptorBuffers,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.worker.descriptor_buffers import (
    _TensorDescriptorBuffers as _TensorDescriptorBuffers,
)
