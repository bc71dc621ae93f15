"""The (gated) delta rule: token-by-token reference, one-token step, chunked parallel form."""
from ltm.ops.delta_rule.chunk import chunk_delta_rule
from ltm.ops.delta_rule.naive import naive_delta_rule
from ltm.ops.delta_rule.step import delta_rule_step

__all__ = ["naive_delta_rule", "delta_rule_step", "chunk_delta_rule"]
