"""Sequence-mixing operators in plain PyTorch: one folder per op, each with `naive.py` (the
token-by-token reference), `chunk.py` (parallel over the sequence) and `step.py` (one token)."""
