"""Triton kernels, imported as `ltm.kernels` (pyproject maps this folder to that package).

One subpackage per op of `ltm.ops`, with the same forms:

    delta_rule/   triton_chunk_delta_rule, triton_delta_rule_step
    rwkv7/        triton_chunk_rwkv7, triton_fused_recurrent_rwkv7, triton_rwkv7_step
    titans/       triton_chunk_titans_memory (linear), triton_chunk_titans_deep_memory (2 layers)
    short_conv.py short_conv_qkv (DeltaNet's fused input path; no op of its own)
    common.py     input checks and tile helpers shared by all of them

Every op here is named `triton_<name of its PyTorch form>`: the PyTorch forms in `ltm.ops` and
these are imported side by side (in `ltm.ops.*.__init__` and in the tests), and distinct names
spare the renaming on import that once hid which one a call ran. `ltm.ops.delta_rule.delta_rule`
and `ltm.ops.rwkv7.rwkv7` pick between them (kernel="triton").
"""
from ltm.kernels.delta_rule import triton_chunk_delta_rule, triton_delta_rule_step
from ltm.kernels.rwkv7 import triton_chunk_rwkv7, triton_fused_recurrent_rwkv7, triton_rwkv7_step
from ltm.kernels.short_conv import short_conv_qkv

__all__ = ["short_conv_qkv", "triton_chunk_delta_rule", "triton_chunk_rwkv7",
           "triton_delta_rule_step", "triton_fused_recurrent_rwkv7", "triton_rwkv7_step"]
