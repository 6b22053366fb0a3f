# Stub of the parts of vLLM that bucketpool reads; see typings/README.md.

__version__: str
