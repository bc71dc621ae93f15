"""Token mixers: causal softmax attention, RWKV-7 time mixing and the (hierarchical) gated DeltaNet.

Every mixer has one interface:

    y, state = mixer(x, state=None)          x, y: (B, T, d_model)

With `state=None` the whole sequence is processed in parallel and no state is returned (training).
With a state from `mixer.init_state(...)` the mixer continues from it and returns the advanced state
(generation): T > 1 is a parallel prefill (the chunk form with an initial state, or the KV cache
filled at once), T == 1 is one decoding step (the step form, or one query against the KV cache).

The linear mixers reach their recurrence through the op entry points `ltm.ops.delta_rule` and
`ltm.ops.rwkv7` (a sequence form and a one-token form each), which pick the implementation named by
`model.kernel`: the token-by-token reference (`naive`), the chunked PyTorch form (`torch`), our
Triton kernels (`triton`), flash-linear-attention (`fla`) or, per call, the faster of the last two
as measured on this GPU (`auto`). This module holds the layers' maths.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ltm.model.config import ModelConfig
from ltm.ops.delta_rule import delta_rule, delta_rule_one_token
from ltm.ops.dual_delta_rule import dual_delta_rule, dual_delta_rule_one_token, init_dual_state
from ltm.ops.rwkv7 import rwkv7, rwkv7_one_token


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent states are kept in float32 (float64 for a float64 model)."""
    return torch.promote_types(dtype, torch.float32)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (max_seq_len, head_dim // 2)."""
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of x (B, H, T, D) by the angles of its T positions."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Causal attention in which each query sees itself and the window - 1 keys before it, in
    blocks: q, k, v (B, H, T, D). The sequence is cut into blocks of `window` queries, each of
    which attends to its own block and the one before, which hold every key it may see: 2 * T *
    window scores instead of the T^2 a full mask costs (T = 8192, window 64: 64x fewer)."""
    B, H, T, D = q.shape
    n = -(-T // window)
    pad = n * window - T
    # (B, H, n, window, D) each
    q, k, v = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, window, D) for x in (q, k, v))
    # each block's keys: the block before (zeros before the first) and its own, (B, H, n, 2w, D)
    k, v = (torch.cat([F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1], x], dim=3) for x in (k, v))
    # query i of block b sits at b * w + i, key j at (b - 1) * w + j: visible when it is no later
    # than the query, fewer than `window` before it, and not before the sequence's start
    i = torch.arange(window, device=q.device)[:, None]
    j = torch.arange(2 * window, device=q.device)[None, :]
    lag = i + window - j
    first = torch.arange(n, device=q.device)[:, None, None] == 0
    mask = (lag >= 0) & (lag < window) & ~(first & (j < window))  # (n, w, 2w)
    y = F.scaled_dot_product_attention(
        q.reshape(B, H * n, window, D), k.reshape(B, H * n, 2 * window, D),
        v.reshape(B, H * n, 2 * window, D), attn_mask=mask.repeat(H, 1, 1))
    # reshape, not view: the CUDA kernels return y in a (B, n, w, H, D)-like layout
    return y.reshape(B, H, n * window, D)[:, :, :T]


class Attention(nn.Module):
    """Causal softmax self-attention with RoPE; with `window` each token sees itself and the
    window - 1 tokens before it. Its generation state is a preallocated KV cache of max_seq_len."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.window, self.max_seq_len = cfg.window, cfg.max_seq_len
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        cos, sin = rope_tables(self.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def init_state(self, batch: int, device: torch.device, dtype: torch.dtype,
                   length: int | None = None) -> dict:
        """KV cache of `length` positions (default max_seq_len): a generation that knows its
        length needs no more, and the cache is most of decoding's memory."""
        shape = (batch, self.n_heads, length or self.max_seq_len, self.head_dim)
        return {"k": torch.zeros(shape, device=device, dtype=dtype),
                "v": torch.zeros(shape, device=device, dtype=dtype), "pos": 0}

    def forward(self, x: torch.Tensor, state: dict | None = None):
        B, T, C = x.shape
        if state is not None and torch.is_tensor(state["pos"]):
            return self._forward_static(x, state)
        pos = 0 if state is None else state["pos"]
        if pos + T > self.max_seq_len:
            raise ValueError(f"x: position {pos + T} is past model.max_seq_len={self.max_seq_len}")
        # (B, H, T, D) each
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        key_start = 0
        if state is not None:
            state["k"][:, :, pos:pos + T] = k
            state["v"][:, :, pos:pos + T] = v
            # keys older than the window of the first query are never needed
            key_start = 0 if self.window is None else max(0, pos - self.window + 1)
            k, v = state["k"][:, :, key_start:pos + T], state["v"][:, :, key_start:pos + T]
            state = {"k": state["k"], "v": state["v"], "pos": pos + T}
        y = self._attend(q, k, v, pos, key_start)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C)), state

    def _forward_static(self, x: torch.Tensor, state: dict):
        """The static-cache step of ltm.generate: state["pos"] is a (B,) tensor, each sequence's
        own position, so one compiled / CUDA-graph-captured step serves every position (a Python
        int would recompile or re-capture per token) and ragged batches decode together. Keys and
        values are written in place at those positions; queries attend over the whole cache,
        masked to each sequence's past. The caller keeps positions inside the cache."""
        B, T, C = x.shape
        H, D = self.n_heads, self.head_dim
        # (B, T): the absolute position of each new token
        positions = state["pos"][:, None] + torch.arange(T, device=x.device)
        # (B, H, T, D) each
        q, k, v = self.qkv(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        # (B, 1, T, D / 2): each row rotated by its own positions
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        index = positions[:, None, :, None].expand(B, H, T, D)
        state["k"].scatter_(2, index, k.to(state["k"].dtype))
        state["v"].scatter_(2, index, v.to(state["v"].dtype))
        # (B, 1, T, S): key j is visible to the query at position p when j <= p (and in the window)
        key_pos = torch.arange(state["k"].shape[2], device=x.device)
        mask = key_pos <= positions[..., None]
        if self.window is not None:
            mask = mask & (positions[..., None] - key_pos < self.window)
        y = F.scaled_dot_product_attention(q, state["k"].to(q.dtype), state["v"].to(q.dtype),
                                           attn_mask=mask[:, None])
        y = self.out_proj(y.transpose(1, 2).reshape(B, T, C))
        return y, {"k": state["k"], "v": state["v"], "pos": state["pos"] + T}

    def _attend(self, q, k, v, query_start: int, key_start: int) -> torch.Tensor:
        T, S = q.shape[2], k.shape[2]
        if self.window is None and T == S:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if T == S and query_start == key_start == 0 and T > 2 * self.window:
            return windowed_attention(q, k, v, self.window)
        if T == 1:
            # the caller sliced the cache to exactly the keys this query may see
            return F.scaled_dot_product_attention(q, k, v)
        query_pos = query_start + torch.arange(T, device=q.device)[:, None]
        key_pos = key_start + torch.arange(S, device=q.device)[None, :]
        mask = key_pos <= query_pos
        if self.window is not None:
            mask = mask & (query_pos - key_pos < self.window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class ShortConv(nn.Module):
    """Depthwise causal convolution over time followed by SiLU; its state is the last
    conv_size - 1 inputs, (B, channels, conv_size - 1)."""

    def __init__(self, channels: int, conv_size: int):
        super().__init__()
        self.conv_size = conv_size
        self.weight = nn.Parameter(torch.empty(channels, 1, conv_size))
        nn.init.uniform_(self.weight, -conv_size ** -0.5, conv_size ** -0.5)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None):
        B, T, channels = x.shape
        if state is None:
            state = x.new_zeros(B, channels, self.conv_size - 1)
        # (B, conv_size - 1 + T, channels): the past inputs stand in for zero padding. Time stays
        # the middle axis: transposing (B, T, 3C) activations twice per layer cost more GPU time
        # than the convolution itself
        x = torch.cat([state.transpose(1, 2).to(x.dtype), x], dim=1)
        # (conv_size, channels), in the activations' dtype so bf16 stays bf16 under autocast
        weight = self.weight[:, 0].t().to(x.dtype)
        # F.conv1d in a few shifted multiply-adds: the same sum, but CPU conv1d (oneDNN) takes
        # tens of ms per call for T = 1 decoding steps and float64
        y = sum(x[:, j:j + T] * weight[j] for j in range(self.conv_size))
        return F.silu(y), x[:, -(self.conv_size - 1):].transpose(1, 2)


def fused_conv_runs(kernel: str, fused_conv: bool, device: torch.device) -> bool:
    """Whether a training step takes the fused convolution (`model.fused_conv`): with our kernels,
    and under auto on a GPU: the convolution is no op auto measures, and without a measurement
    auto takes ours."""
    return fused_conv and (kernel == "triton" or (kernel == "auto" and device.type == "cuda"))


def convolved_qkv(qkv: torch.Tensor, conv: ShortConv | None, state: dict | None, n_heads: int,
                  fused: bool) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, T, H, D) from the projections qkv (B, T, 3C): the short convolution (when
    `conv`), then q and k L2-normalised; and the convolution's new state (None without a
    `state`, whose "conv" entry holds the last inputs). `fused`: training on a GPU takes the
    convolution, SiLU and the norms in one Triton op."""
    B, T, C3 = qkv.shape
    D = C3 // (3 * n_heads)
    conv_state = None
    if conv is not None and state is None and fused:
        # imported here: the Triton kernels load only when a fused training step asks for them
        from ltm.kernels.short_conv import short_conv_qkv
        # convolution, SiLU and the L2 norm of q and k in one pass over qkv, and one back
        q, k, v = (t.view(B, T, n_heads, D) for t in short_conv_qkv(qkv, conv.weight[:, 0].t(), D))
        return q, k, v, None
    if conv is not None:
        qkv, conv_state = conv(qkv, None if state is None else state["conv"])
    q, k, v = qkv.view(B, T, 3, n_heads, D).unbind(2)
    return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, conv_state


class RWKV7TimeMix(nn.Module):
    """RWKV-7 time mixing: token shift, data-dependent decay w, in-context learning rate a_lr,
    the generalized delta update with a = -kk, b = kk * a_lr, per-head norm, the r.k bonus and
    an output gate. (The cross-layer value residual of RWKV-7 is left out.)"""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        C, self.n_heads, self.head_dim = cfg.d_model, cfg.n_heads, cfg.d_model // cfg.n_heads
        self.kernel, self.chunk_size = cfg.kernel, cfg.chunk_size
        rank = max(8, C // 16)
        depth = layer / max(1, cfg.n_layers - 1)
        channel = torch.arange(C, dtype=torch.float32) / C
        # token-shift interpolation per channel for r, w, k, v, a, g; deeper layers shift less
        powers = torch.tensor([0.2, 0.9, 0.9, 0.4, 0.9, 0.2]) * (1 - layer / cfg.n_layers)
        self.shift_mix = nn.Parameter(1 - channel[None, :] ** powers[:, None])
        self.receptance = nn.Linear(C, C, bias=False)
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        # decay from slow (first channels) to fast, slower on average in deeper layers
        self.decay_base = nn.Parameter(-7 + 5 * channel ** (0.85 + depth ** 0.5) + 0.5)
        self.decay_down = nn.Linear(C, rank, bias=False)
        self.decay_up = nn.Linear(rank, C, bias=False)
        self.lr_base = nn.Parameter(torch.zeros(C))
        self.lr_down = nn.Linear(C, rank, bias=False)
        self.lr_up = nn.Linear(rank, C, bias=False)
        self.gate_down = nn.Linear(C, rank, bias=False)
        self.gate_up = nn.Linear(rank, C, bias=False)
        self.k_k = nn.Parameter(torch.full((C,), 0.85))
        self.k_a = nn.Parameter(torch.ones(C))
        self.r_k = nn.Parameter(torch.zeros(self.n_heads, self.head_dim))
        self.norm_weight = nn.Parameter(torch.ones(C))
        self.norm_bias = nn.Parameter(torch.zeros(C))
        self.out_proj = nn.Linear(C, C, bias=False)

    def init_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
        H, D = self.n_heads, self.head_dim
        return {"shift": torch.zeros(batch, H * D, device=device, dtype=dtype),
                "wkv": torch.zeros(batch, H, D, D, device=device, dtype=state_dtype(dtype))}

    def forward(self, x: torch.Tensor, state: dict | None = None):
        B, T, C = x.shape
        H, D = self.n_heads, self.head_dim
        previous = x.new_zeros(B, 1, C) if state is None else state["shift"][:, None].to(x.dtype)
        # (B, T, C): x_{t-1} - x_t
        shift = torch.cat([previous, x[:, :-1]], dim=1) - x
        xr, xw, xk, xv, xa, xg = (x + shift * mix for mix in self.shift_mix)
        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        # log decay in (-exp(-0.5), 0): every channel forgets at least a little, never all at once
        w = -torch.exp(-F.softplus(-(self.decay_base + self.decay_up(torch.tanh(self.decay_down(xw)))))
                       - 0.5)
        lr = torch.sigmoid(self.lr_base + self.lr_up(self.lr_down(xa)))
        gate = self.gate_up(torch.sigmoid(self.gate_down(xg)))
        kk = F.normalize((k * self.k_k).view(B, T, H, D), dim=-1)
        k = k * (1 + (lr - 1) * self.k_a)
        r, w, k, v, lr = (t.view(B, T, H, D) for t in (r, w, k, v, lr))
        initial = None if state is None else state["wkv"]
        if state is not None and T == 1:
            o, wkv = rwkv7_one_token(r[:, 0], w[:, 0], k[:, 0], v[:, 0], -kk[:, 0],
                                     (kk * lr)[:, 0], initial, kernel=self.kernel)
            o = o[:, None]
        else:
            o, wkv = rwkv7(r, w, k, v, -kk, kk * lr, kernel=self.kernel, chunk_size=self.chunk_size,
                           initial_state=initial, output_final_state=state is not None)
        o = F.group_norm(o.reshape(B * T, C), H, self.norm_weight, self.norm_bias, eps=64e-5)
        bonus = (r * k * self.r_k).sum(-1, keepdim=True) * v
        y = self.out_proj((o.view(B, T, C) + bonus.reshape(B, T, C)) * gate)
        return y, (None if state is None else {"shift": x[:, -1], "wkv": wkv})


class DeltaNet(nn.Module):
    """Gated DeltaNet: L2-normalised q and k, beta = sigmoid(.), per-head log decay
    g = -exp(A_log) * softplus(. + dt_bias), an optional short causal convolution on q, k, v, and a
    gated per-head RMSNorm on the output. `hierarchical` keeps a fast and a slow state per head
    (the same q, k, v, decays initialised apart) and mixes their outputs by a learned gate.
    The roadmap's switches (model.hier_*, fused_proj; defaults = the layer as it was): the dual
    op reading q, k, v once, the mix by plain sum, the fast state read at chunk boundaries only,
    the event-driven slow state (ltm/ops/dual_delta_rule/step.py defines the last two)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, self.n_heads, self.head_dim = cfg.d_model, cfg.n_heads, cfg.d_model // cfg.n_heads
        self.kernel, self.chunk_size = cfg.kernel, cfg.chunk_size
        self.hierarchical, self.norm_eps = cfg.hierarchical, cfg.norm_eps
        self.fused_conv = cfg.fused_conv
        # one recurrent state per head, two (fast, then slow) when hierarchical
        n_states = 2 * self.n_heads if cfg.hierarchical else self.n_heads
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.conv = ShortConv(3 * C, cfg.conv_size) if cfg.short_conv else None
        # decay rates A: fast states in [1, 16] (Mamba-2's range), slow states in [0.01, 0.1]
        fast = torch.empty(self.n_heads).uniform_(1, 16)
        slow = torch.empty(self.n_heads).uniform_(0.01, 0.1)
        self.A_log = nn.Parameter(torch.cat([fast, slow] if cfg.hierarchical else [fast]).log())
        # time steps in [1e-3, 1e-1], stored through the inverse of softplus
        dt = torch.exp(torch.empty(n_states).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        # the output gate (C), beta and the decay (n_states each) and, when hierarchical, the
        # fast/slow mix (n_heads) from one matmul: as matmuls of their own, beta's and the decay's
        # 12 columns took about 0.08 ms per layer together on an H100 (B8, T2048)
        self.gate_widths = [C, n_states, n_states, self.n_heads if cfg.hierarchical else 0]
        # unused columns up to a multiple of 8: 16-byte rows in bf16, so cuBLAS takes its aligned
        # GEMMs (the hierarchical 828 ran as align2 kernels, 3.6 ms of a 73 ms H100 step)
        self.gate_widths.append(-sum(self.gate_widths) % 8)
        # (the mix columns stay with hier_mix sum, unused: every variant loads the same checkpoint)
        self.gate_proj = nn.Linear(C, sum(self.gate_widths), bias=False)
        self.norm_weight = nn.Parameter(torch.ones(self.head_dim))
        self.out_proj = nn.Linear(C, C, bias=False)
        self.fused_proj, self.mix_kind = cfg.fused_proj, cfg.hier_mix
        # the roadmap's variants of the hierarchical layer (ltm/ops/dual_delta_rule/step.py)
        self.variant = {"fast_read": cfg.hier_fast_read, "slow_threshold": cfg.hier_slow_threshold,
                        "chunk_size": cfg.chunk_size}
        self.dual = cfg.hierarchical and (cfg.hier_op == "dual" or cfg.hier_fast_read == "chunk"
                                          or cfg.hier_slow_threshold is not None)

    def init_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
        n_states = self.A_log.numel()
        D = self.head_dim
        conv = None
        if self.conv is not None:
            conv = torch.zeros(batch, 3 * self.n_heads * D, self.conv.conv_size - 1,
                               device=device, dtype=dtype)
        if self.dual:
            return {"conv": conv, **init_dual_state(
                batch, self.n_heads, D, D, fast_read=self.variant["fast_read"],
                slow_threshold=self.variant["slow_threshold"], device=device,
                dtype=state_dtype(dtype))}
        return {"conv": conv,
                "S": torch.zeros(batch, n_states, D, D, device=device, dtype=state_dtype(dtype))}

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """qkv (B, T, 3C) and the gate columns; with fused_proj from one matmul over the two
        weights concatenated (the parameters stay two, so checkpoints load either way)."""
        if not self.fused_proj:
            return self.qkv(x), self.gate_proj(x)
        weight = torch.cat([self.qkv.weight, self.gate_proj.weight])
        return F.linear(x, weight).split([self.qkv.out_features, self.gate_proj.out_features], -1)

    def _recurrence(self, q, k, v, beta, g, state: dict | None):
        """The delta rule(s): o (B, T, n_states, D) and the new recurrent part of the state."""
        T = q.shape[1]
        if self.dual:
            recurrent = None if state is None else {key: value for key, value in state.items()
                                                    if key != "conv"}
            if recurrent is not None and T == 1:
                o, new = dual_delta_rule_one_token(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g[:, 0],
                                                   recurrent, **self.variant)
                return o[:, None], new
            return dual_delta_rule(q, k, v, beta, g, kernel=self.kernel, state=recurrent,
                                   output_final_state=state is not None, **self.variant)
        if self.hierarchical:
            # fast and slow states read and write the same q, k, v: stack them as extra heads
            q, k, v = (torch.cat([t, t], dim=2) for t in (q, k, v))
        initial = None if state is None else state["S"]
        if state is not None and T == 1:
            o, S = delta_rule_one_token(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g[:, 0], initial,
                                        kernel=self.kernel)
            return o[:, None], {"S": S}
        o, S = delta_rule(q, k, v, beta, g, kernel=self.kernel, chunk_size=self.chunk_size,
                          initial_state=initial, output_final_state=state is not None)
        return o, {"S": S}

    def forward(self, x: torch.Tensor, state: dict | None = None):
        B, T, C = x.shape
        H, D = self.n_heads, self.head_dim
        qkv, gates = self._project(x)
        fused = fused_conv_runs(self.kernel, self.fused_conv, x.device)
        q, k, v, conv_state = convolved_qkv(qkv, self.conv, state, H, fused)
        gate, beta, g, mix, _ = gates.split(self.gate_widths, dim=-1)
        # (B, T, n_states)
        beta = torch.sigmoid(beta)
        g = -self.A_log.exp() * F.softplus(g + self.dt_bias)
        o, recurrent = self._recurrence(q, k, v, beta, g, state)
        if self.hierarchical:
            fast, slow = o.chunk(2, dim=2)
            if self.mix_kind == "sum":
                o = fast + slow
            else:
                mix = torch.sigmoid(mix)[..., None]
                o = mix * fast + (1 - mix) * slow
        # (B, T, H, D)
        # the weight in o's dtype: with a float32 weight on bf16 o, torch falls back from its fused
        # kernel (and warns)
        o = F.rms_norm(o, (D,), self.norm_weight.to(o.dtype), self.norm_eps)
        o = o * F.silu(gate).reshape(B, T, H, D)
        y = self.out_proj(o.reshape(B, T, C))
        return y, (None if state is None else {"conv": conv_state, **recurrent})


def make_mixer(cfg: ModelConfig, layer: int) -> nn.Module:
    """The token mixer named by cfg.mixer."""
    if cfg.mixer == "attention":
        return Attention(cfg)
    if cfg.mixer == "rwkv7":
        return RWKV7TimeMix(cfg, layer)
    if cfg.mixer == "deltanet":
        return DeltaNet(cfg)
    if cfg.mixer == "titans":
        raise ValueError("mixer: 'titans' is built by ltm.model.lm.build_mixer (ltm.model.titans)")
    raise ValueError(f"mixer: unknown mixer {cfg.mixer!r}, expected attention, rwkv7 or deltanet")
