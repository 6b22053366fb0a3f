# A package on the way to the descriptor_buffers module; nothing else in it is stubbed.
