"""The LTM decoder: a LLaMA-style stack (RMSNorm, RoPE, SwiGLU MLP, tied embeddings) whose token
mixer is softmax attention, RWKV-7, (hierarchical) gated DeltaNet or Titans, and whose every layer can
cross-attend to its own slice of latent thought vectors z.

    model = LTM(ModelConfig(vocab_size=2048, mixer="deltanet"))
    logits, loss = model(idx, targets, z=z)          # idx (B, T); z (B, n_layers * n_latent, C)
    out = model.generate(idx, z=z, max_new_tokens=64, temperature=0)
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# ModelConfig lives in ltm.model.config (ltm.model.mixers needs it too); imported here for the model and
# re-exported, so `from ltm.model.lm import ModelConfig` keeps working
from ltm.model.config import ModelConfig
from ltm.model.cross_entropy import IGNORE_INDEX
from ltm.model.mixers import make_mixer
from ltm.model.titans import Titans
from ltm.ops import check_kernel
from ltm.params import ParamsError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.out_proj = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.out_proj(F.silu(gate) * up)


class LatentCrossAttention(nn.Module):
    """Tokens (queries) attend to the layer's n_latent thought vectors (keys and values), no mask
    and no positions: every token sees every latent."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        # model.latent_norm false: no norm, z's scale reaches the keys and values
        self.latent_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.latent_norm else None
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def latent_kv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, n_latent, D) of the latents z (B, n_latent, C); generation
        computes them once."""
        B, L, _ = z.shape
        if self.latent_norm is not None:
            z = self.latent_norm(z)
        k, v = self.kv_proj(z).view(B, L, 2, self.n_heads, self.head_dim).unbind(2)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, *kv)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


def build_mixer(cfg: ModelConfig, layer: int) -> nn.Module:
    """The token mixer named by cfg.mixer, Titans included (it lives in a module of its own,
    which builds on mixers.Attention, so mixers.make_mixer cannot import it)."""
    return Titans(cfg) if cfg.mixer == "titans" else make_mixer(cfg, layer)


class Block(nn.Module):
    """Pre-norm residual block: token mixer, then (with latents) cross-attention, then MLP."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.mixer_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = build_mixer(cfg, layer)
        self.cross_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.n_latent > 0 else None
        self.cross = LatentCrossAttention(cfg) if cfg.n_latent > 0 else None
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, latent_kv=None, state: dict | None = None):
        y, state = self.mixer(self.mixer_norm(x), state)
        x = x + y
        if latent_kv is not None:
            x = x + self.cross(self.cross_norm(x), latent_kv)
        x = x + self.mlp(self.mlp_norm(x))
        return x, state


@dataclasses.dataclass
class Cache:
    """What cached generation carries from one call to the next (see LTM.new_cache)."""

    # one mixer state per layer: KV cache, or recurrent state plus token-shift / conv inputs
    states: list[dict]
    # per layer, the latents' cross-attention keys and values, or None without z
    latent_kv: list[tuple[torch.Tensor, torch.Tensor]] | None
    # tokens consumed so far
    pos: int = 0


class LTM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ParamsError("model.vocab_size: must be > 0 to build a model (0 means: set it from "
                              "the tokenizer)")
        try:
            check_kernel(cfg.kernel)
        except ValueError as err:
            raise ParamsError(f"model.{err}") from None
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # tied embeddings: the head reads logits off the embedding table
        self.lm_head.weight = self.embed.weight
        # the amortised start of q(z) (train.latent.init encoder), attached after construction
        # by ltm.latent.encoder: part of the model's parameters and state dict, never of hidden()
        self.encoder: nn.Module | None = None
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
        # every residual branch ends in an out_proj: scale those so the residual stream's
        # variance does not grow with depth (GPT-2)
        for name, param in self.named_parameters():
            if name.endswith("out_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))

    def _latent_slices(self, z: torch.Tensor | None, batch: int) -> list | None:
        """z (B, n_layers * n_latent, C) as one (B, n_latent, C) slice per layer."""
        if z is None:
            return None
        cfg = self.cfg
        if cfg.n_latent == 0:
            raise ValueError("z: given, but model.n_latent is 0 (a plain language model)")
        expected = (batch, cfg.n_layers * cfg.n_latent, cfg.d_model)
        if tuple(z.shape) != expected:
            raise ValueError(f"z: expected shape {expected} (B, n_layers * n_latent, d_model), "
                             f"got {tuple(z.shape)}")
        return list(z.split(cfg.n_latent, dim=1))

    def hidden(self, idx: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden states (B, T, d_model) of tokens idx (B, T), whole sequence in
        parallel; z (B, n_layers * n_latent, d_model) or None (no cross-attention)."""
        B, T = idx.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"idx: length {T} is longer than model.max_seq_len={self.cfg.max_seq_len}")
        latents = self._latent_slices(z, B)
        x = self.embed(idx)
        for layer, block in enumerate(self.blocks):
            kv = None if latents is None else block.cross.latent_kv(latents[layer])
            if self.cfg.checkpointing and torch.is_grad_enabled():
                x, _ = checkpoint(block, x, kv, use_reentrant=False)
            else:
                x, _ = block(x, kv)
        return self.final_norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                z: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) of idx (B, T) and, given targets (B, T) (IGNORE_INDEX = -100 left
        out, as in the chunked loss), the mean cross-entropy loss."""
        logits = self.lm_head(self.hidden(idx, z))
        if targets is None:
            return logits, None
        # the loss in at least float32, also under bf16 autocast
        wide = logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))
        loss = F.cross_entropy(wide, targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    def new_cache(self, batch: int, z: torch.Tensor | None = None) -> Cache:
        """Empty generation state for `batch` sequences: preallocated KV caches or zero recurrent
        states, and the latents' keys and values computed once."""
        weight = self.embed.weight
        states = [block.mixer.init_state(batch, weight.device, weight.dtype) for block in self.blocks]
        return Cache(states=states, latent_kv=self.latent_kv(z, batch))

    def latent_kv(self, z: torch.Tensor | None, batch: int) -> list | None:
        """Per layer, the cross-attention keys and values of the latents z, or None without z."""
        latents = self._latent_slices(z, batch)
        if latents is None:
            return None
        return [block.cross.latent_kv(latents[i]) for i, block in enumerate(self.blocks)]

    def forward_cached(self, idx: torch.Tensor, cache: Cache, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, vocab) of idx (B, T) continuing from `cache`, which is advanced by T
        tokens: T > 1 is a parallel prefill, T == 1 one decoding step. last_only: logits of the
        last position only, (B, 1, vocab)."""
        T = idx.shape[1]
        if cache.pos + T > self.cfg.max_seq_len:
            raise ValueError(f"idx: generation would reach position {cache.pos + T}, past "
                             f"model.max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(idx)
        for layer, block in enumerate(self.blocks):
            kv = None if cache.latent_kv is None else cache.latent_kv[layer]
            x, cache.states[layer] = block(x, kv, cache.states[layer])
        cache.pos += T
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.final_norm(x))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, z: torch.Tensor | None = None, max_new_tokens: int = 64,
                 temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None,
                 top_p: float | None = None) -> torch.Tensor:
        """Continue idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens). The
        prompt is prefilled once in parallel, then each token is one step from the cache.
        temperature 0 = greedy; top_k / top_p: see `sample`. The readable reference of the fast
        path in ltm.generate (static cache, captured step)."""
        if max_new_tokens < 0 or temperature < 0:
            raise ValueError(f"max_new_tokens and temperature must be >= 0, got {max_new_tokens} "
                             f"and {temperature}")
        # the last sampled token is never fed back, so it needs no position
        last = idx.shape[1] + max(max_new_tokens - 1, 0)
        if last > self.cfg.max_seq_len:
            raise ValueError(f"max_new_tokens: generation would reach position {last}, past "
                             f"model.max_seq_len={self.cfg.max_seq_len}")
        cache = self.new_cache(idx.shape[0], z)
        logits = self.forward_cached(idx, cache, last_only=True)
        tokens = [idx]
        for step in range(max_new_tokens):
            tokens.append(sample(logits[:, -1], temperature, top_k, generator, top_p))
            if step + 1 < max_new_tokens:
                logits = self.forward_cached(tokens[-1], cache)
        return torch.cat(tokens, dim=1)

    @torch.no_grad()
    def generate_uncached(self, idx: torch.Tensor, z: torch.Tensor | None = None,
                          max_new_tokens: int = 64, temperature: float = 1.0,
                          top_k: int | None = None,
                          generator: torch.Generator | None = None,
                          top_p: float | None = None) -> torch.Tensor:
        """The slow reference of `generate`: the whole sequence is recomputed for every token."""
        for _ in range(max_new_tokens):
            logits = self.lm_head(self.hidden(idx, z)[:, -1])
            idx = torch.cat([idx, sample(logits, temperature, top_k, generator, top_p)], dim=1)
        return idx

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding leaves out the (tied) token embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token at sequence length seq_len, for MFU:

            6 * N + 6 * d_model * vocab + n_layers * (mixer + latents)

        N counts the weights applied to every token (non-embedding parameters except the
        latents' key/value projections and norms, and the encoder of q's start, if any): 2 FLOPs
        per weight forward, 4 backward. The tied head's matmul is 6 * d_model * vocab (its weight
        is the embedding, not in N).
        mixer, per layer: attention 12 * d_model * context with context = min(seq_len, window)
        (PaLM's count: q.k and p.v over the whole context, not halved for causality); rwkv7 and
        deltanet 18 * n_states * D * D (the D x D state is read, written and queried once per
        token, 2 * D * D FLOPs each, times 3 for forward + backward; n_states = 2 * n_heads when
        hierarchical); titans the window attention's 12 * d_model * min(seq_len, titans_window)
        plus 24 * n_heads * P per head's memory of P weights (per token: the gradient's forward and
        backward pass, the rank-one update and the read, 2 * P FLOPs each, times 3; the chunk's
        C x C terms are left out). latents, per layer: the cross-attention,
        12 * d_model * n_latent, plus the latents' key/value projection, done once per sequence,
        6 * 2 * d_model^2 * n_latent / seq_len."""
        cfg = self.cfg
        if cfg.mixer == "attention":
            context = seq_len if cfg.window is None else min(seq_len, cfg.window)
            mixer = 12 * cfg.d_model * context
        elif cfg.mixer == "titans":
            widths = [cfg.head_dim] + [cfg.titans_expansion * cfg.head_dim] * (cfg.titans_depth - 1)
            memory = sum(a * b for a, b in zip(widths, widths[1:] + [cfg.head_dim]))
            mixer = (12 * cfg.d_model * min(seq_len, cfg.titans_window)
                     + 24 * cfg.n_heads * memory)
        else:
            n_states = 2 * cfg.n_heads if cfg.hierarchical else cfg.n_heads
            mixer = 18 * n_states * cfg.head_dim ** 2
        # the encoder runs once per sequence beside the decoder: not a weight of every token
        per_token_params = self.num_params(non_embedding=True) - (
            0 if self.encoder is None else sum(p.numel() for p in self.encoder.parameters()))
        latents = 0.0
        if cfg.n_latent > 0:
            per_sequence = sum(p.numel() for block in self.blocks
                               for m in (block.cross.kv_proj, block.cross.latent_norm)
                               if m is not None for p in m.parameters())
            per_token_params -= per_sequence
            kv_params = 2 * cfg.d_model ** 2
            latents = 12 * cfg.d_model * cfg.n_latent + 6 * kv_params * cfg.n_latent / seq_len
        return (6 * per_token_params + 6 * cfg.d_model * cfg.vocab_size
                + cfg.n_layers * (mixer + latents))


def sample(logits: torch.Tensor, temperature: float, top_k: int | None = None,
           generator: torch.Generator | None = None, top_p: float | None = None) -> torch.Tensor:
    """One token (B, 1) from logits (B, vocab): argmax when temperature == 0, else a draw from
    softmax(logits / temperature) kept to the top_k most likely tokens and to the fewest most
    likely tokens whose probability reaches top_p (nucleus). Tensor ops only, no host sync, so a
    CUDA graph can hold it: the draw is argmax(p / e) with e ~ Exp(1) per token (the exponential
    race, which picks token i with probability p_i)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # a token goes when the more likely ones already reach top_p: the first always stays
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    # clamped: an exact zero draw would give 0 / 0 = nan for a token of probability 0
    race = torch.empty_like(probs).exponential_(generator=generator).clamp_min(1e-30)
    return (probs / race).argmax(dim=-1, keepdim=True)
