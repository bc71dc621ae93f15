"""The (gated) delta rule in Triton, one module per form of `ltm.ops.delta_rule`:

    chunk.py      triton_chunk_delta_rule   sequence form, forward and backward (the launchers and
                                            autograd Function; kernels in chunk_prep.py,
                                            chunk_fwd.py, chunk_bwd.py;
                                            launch configurations in launch_choices.py,
                                            segments and warm-ups in segment_choices.py)
    step.py       triton_delta_rule_step    one token, forward only (decoding)

Inputs [B, T, H, K] / [B, T, H, V] (one token: [B, H, K]), states [B, H, K, V] float32.
"""
from ltm.kernels.delta_rule.chunk import triton_chunk_delta_rule
from ltm.kernels.delta_rule.step import triton_delta_rule_step

__all__ = ["triton_chunk_delta_rule", "triton_delta_rule_step"]
