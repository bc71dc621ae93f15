"""The bar the train stage must beat: a plain nanoGPT-class GPT-2-small training step (learned
positions, LayerNorm, GELU MLP, SDPA causal attention, tied head, fused AdamW, bf16 autocast),
timed on random tokens the way `ltm.stages.train` times its own runs.

    python -m ltm.bench.gpt2_baseline [--batch 16] [--seq-len 1024] [--compile] [--steps 40]

Prints one JSON line: tokens/s and MFU against 989 TFLOP/s with FLOPs per token
6 N + 12 n_layers d_model T (N: every parameter but the position table, the tied embedding
included; PaLM's attention count, not halved for causality), the formula nanoGPT reports MFU with.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from ltm.bench.timing import device_sync, per_call_ms

PEAK_FLOPS = 989e12


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, n_heads, T, head_dim) each
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 50304, d: int = 768, n_layers: int = 12, n_heads: int = 12,
                 max_len: int = 8192):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def measure(batch: int = 16, seq_len: int = 1024, steps: int = 40, warmup: int = 10,
            compile: bool = True, device: str = "cuda", size: dict | None = None) -> dict:
    """tokens/s and MFU of the plain loop (random tokens; steps after `warmup` untimed ones).
    size: GPT's keyword arguments (default GPT-2 small); the levers bench passes a tiny one on a
    CPU, where no MFU is reported."""
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(**(size or {})).to(device)
    # nanoGPT leaves the position table out of N: a lookup, not a matmul
    n_params = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    cuda = device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=cuda)
    step_fn = torch.compile(model) if compile else model
    vocab = model.tok.num_embeddings
    tokens = batch * seq_len

    def step() -> None:
        x = torch.randint(vocab, (batch, seq_len + 1), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = step_fn(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    # the steps back to back between two synchronisations, as nanoGPT's loop runs them
    step_ms = per_call_ms(step, steps - warmup, warmup=warmup, sync=device_sync(device))
    tokens_per_s = tokens / (step_ms / 1e3)
    flops_per_token = 6 * n_params + 12 * len(model.blocks) * model.tok.embedding_dim * seq_len
    return {"run": "gpt2-baseline", "batch_size": batch, "seq_len": seq_len, "compile": compile,
            "params": n_params, "tokens_per_s": round(tokens_per_s),
            "mfu": round(tokens_per_s * flops_per_token / PEAK_FLOPS, 4) if cuda else None,
            "peak_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    print(json.dumps(measure(args.batch, args.seq_len, args.steps, args.warmup, args.compile)),
          flush=True)


if __name__ == "__main__":
    main()
