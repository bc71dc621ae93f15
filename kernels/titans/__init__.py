"""The Titans memory in Triton (sequence form): `triton_chunk_titans_memory` (the linear memory)
and `triton_chunk_titans_deep_memory` (two layers, SiLU between). One-token decoding runs
`ltm.ops.titans.titans_memory_step` (a few small matmuls)."""
from ltm.kernels.titans.chunk import CHUNK_SIZES, triton_chunk_titans_memory
from ltm.kernels.titans.deep import DEEP_CHUNK_SIZES, triton_chunk_titans_deep_memory

__all__ = ["CHUNK_SIZES", "DEEP_CHUNK_SIZES", "triton_chunk_titans_deep_memory",
           "triton_chunk_titans_memory"]
