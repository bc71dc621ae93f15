"""The RWKV-7 recurrence: token-by-token reference, one-token step, chunked parallel form."""
from ltm.ops.rwkv7.chunk import chunk_rwkv7
from ltm.ops.rwkv7.naive import naive_rwkv7
from ltm.ops.rwkv7.step import rwkv7_step

__all__ = ["naive_rwkv7", "rwkv7_step", "chunk_rwkv7"]
