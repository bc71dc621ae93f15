"""The RWKV-7 recurrence in Triton, one module per form of `ltm.ops.rwkv7`:

    chunk.py            triton_chunk_rwkv7             sequence form, chunk-parallel, forward and
                                                       backward (kernels in chunk_fwd.py, chunk_bwd.py);
                                                       what the model runs
    fused_recurrent.py  triton_fused_recurrent_rwkv7   sequence form as a fused token loop: a second,
                                                       simpler implementation to check and time against
    step.py             triton_rwkv7_step              one token, forward only (decoding)

Inputs [B, T, H, K] / [B, T, H, V] (one token: [B, H, K]), states [B, H, K, V] float32.
"""
from ltm.kernels.rwkv7.chunk import triton_chunk_rwkv7
from ltm.kernels.rwkv7.fused_recurrent import triton_fused_recurrent_rwkv7
from ltm.kernels.rwkv7.step import triton_rwkv7_step

__all__ = ["triton_chunk_rwkv7", "triton_fused_recurrent_rwkv7", "triton_rwkv7_step"]
