"""The Titans memory in Triton (linear memory, sequence form): `triton_chunk_titans_memory`.
One-token decoding runs `ltm.ops.titans.titans_memory_step` (a few small matmuls)."""
from ltm.kernels.titans.chunk import CHUNK_SIZES, triton_chunk_titans_memory

__all__ = ["CHUNK_SIZES", "triton_chunk_titans_memory"]
