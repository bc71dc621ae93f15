"""Triton kernels, imported as `ltm.kernels`: the chunked delta rule and RWKV-7 (forward and
backward), RWKV-7 as a fused token loop, their one-token step kernels for decoding, and
DeltaNet's fused short convolution."""
from ltm.kernels.delta_rule import chunk_delta_rule
from ltm.kernels.rwkv7 import fused_recurrent_rwkv7
from ltm.kernels.rwkv7_chunk import chunk_rwkv7
from ltm.kernels.short_conv import short_conv_qkv
from ltm.kernels.step import delta_rule_step, rwkv7_step

__all__ = ["chunk_delta_rule", "chunk_rwkv7", "delta_rule_step", "fused_recurrent_rwkv7",
           "rwkv7_step", "short_conv_qkv"]
