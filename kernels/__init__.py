"""Triton kernels, imported as `ltm.kernels`: the chunked delta rule and RWKV-7 (forward and
backward) and their one-token step kernels for decoding."""
from ltm.kernels.delta_rule import chunk_delta_rule
from ltm.kernels.rwkv7 import chunk_rwkv7
from ltm.kernels.step import delta_rule_step, rwkv7_step

__all__ = ["chunk_delta_rule", "chunk_rwkv7", "delta_rule_step", "rwkv7_step"]
