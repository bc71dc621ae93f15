"""The Titans token mixer: a neural long-term memory (ltm/ops/titans) beside sliding-window
attention, in one of two arrangements (Behrouz et al., 2024):

    mag   memory as a gate: y = g * attention(x) + (1 - g) * memory(x), g = sigmoid(W_g x) per
          channel (output mixing: both branches read x in parallel)
    mal   memory as a layer: m = memory(x); y = m + attention(x + m) (the memory's output enters
          the attention's input as a residual, so attention still sees x while m is small)

The memory branch: q, k, v projected per head (q and k L2-normalised, so the associative loss has
keys of unit norm), per token and head eta = sigmoid(.) (momentum, starts near 0.1), the step
size theta = sigmoid(.) (starts near 0.1), or with a bound b (ModelConfig.titans_max_step: a
chunk's summed step, by default for memories deeper than 1) theta = (b / titans_chunk_size)
(1 - eta) sigmoid(.) (starting at 3/4 of its bound), and alpha = sigmoid(.) (forgetting, starts
near 0.01);
the read o = M(q) per head, RMS-normalised, then an output projection. The memory's initial
weights are parameters: the MLP's first layers start random (a zero MLP has zero gradients) and its
last layer, like the linear memory, starts at zero, so M reads zero before it has learned anything.

Generation state: one flat dict, {"k", "v", "pos"} of the attention's KV cache (pos: tokens so
far, also the memory's position) and per memory layer l "memory_w{l}", "memory_s{l}",
"memory_c{l}": the weights, momentum and chunk-start weights, the weights kept as offsets from
the learned initial ones. So an all-zero state is the state before the first token, as for the
other mixers, and the static-cache decoder (ltm/model/decoding.py) zeroes, copies rows and
captures steps of it like any other. With model.kernel
torch the memory runs in chunks (its mini-batch is model.titans_chunk_size, part of the function);
naive is the token loop; triton the Triton kernels, for titans_depth 1 or 2 (`ltm.ops.titans`);
fla only for the linear memory with titans_chunk_size 1 and no clipping;
auto triton where it runs, else (`ltm.ops.auto`) the faster measured of fla and torch in fla's case,
else torch.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ltm.model.config import (TITANS_ALPHA_INIT, TITANS_ETA_INIT, TITANS_THETA_INIT,
                              TITANS_THETA_SIGMOID_INIT, ModelConfig)
from ltm.model.mixers import Attention, ShortConv, convolved_qkv, fused_conv_runs, state_dtype
from ltm.ops.titans import TitansState, titans_memory, titans_memory_one_token


class Titans(nn.Module):
    """The Titans mixer (MAG or MAL); see the module docstring."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, H, D = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.head_dim, self.norm_eps = H, D, cfg.norm_eps
        self.kernel, self.chunk_size = cfg.kernel, cfg.titans_chunk
        self.grad_clip, self.arrangement = cfg.titans_grad_clip, cfg.titans_arrangement
        # the bound on each token's theta / (1 - eta), or None (ModelConfig.titans_max_step)
        bound = cfg.titans_step_bound
        self.token_step = None if bound is None else bound / cfg.titans_chunk
        self.attn = Attention(dataclasses.replace(cfg, mixer="attention", window=cfg.titans_window))
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        # Titans' depthwise causal convolution after the q, k, v projections (as DeltaNet's): a
        # key can carry its neighbour, which associative recall needs of a memory keyed per token
        self.conv = ShortConv(3 * C, cfg.conv_size) if cfg.short_conv else None
        self.fused_conv = cfg.fused_conv
        # theta, alpha, eta (H columns each) and, for mag, the C columns of the output gate
        self.gate_widths = [3 * H, C if self.arrangement == "mag" else 0]
        self.gate_proj = nn.Linear(C, sum(self.gate_widths), bias=False)
        # the sigmoid's inverse of the initial values, by tensor ops (also under a meta device)
        theta_sigmoid = TITANS_THETA_INIT if self.token_step is None else TITANS_THETA_SIGMOID_INIT
        inits = torch.tensor([theta_sigmoid, TITANS_ALPHA_INIT, TITANS_ETA_INIT])
        inits = inits.repeat_interleave(H)
        self.gate_bias = nn.Parameter(torch.log(inits / (1 - inits)))
        dims = [D] + [cfg.titans_expansion * D] * (cfg.titans_depth - 1) + [D]
        self.memory = nn.ParameterList(
            nn.Parameter(torch.randn(H, d_in, d_out) * d_in ** -0.5 if layer < len(dims) - 2
                         else torch.zeros(H, d_in, d_out))
            for layer, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])))
        self.norm_weight = nn.Parameter(torch.ones(D))
        self.out_proj = nn.Linear(C, C, bias=False)

    def init_state(self, batch: int, device: torch.device, dtype: torch.dtype,
                   length: int | None = None) -> dict:
        """The state before the first token (see the module docstring); `length` positions of
        KV cache (default max_seq_len)."""
        state = self.attn.init_state(batch, device, dtype, length=length)
        if self.conv is not None:
            state["conv"] = torch.zeros(batch, self.conv.weight.shape[0], self.conv.conv_size - 1,
                                        device=device, dtype=dtype)
        for layer, w in enumerate(self.memory):
            for part in "wsc":
                state[f"memory_{part}{layer}"] = torch.zeros(batch, *w.shape, device=device,
                                                             dtype=state_dtype(dtype))
        return state

    def _unpack(self, state: dict) -> TitansState:
        """The op's state from the flat dict: weights = initial weights + the stored offsets."""
        L = range(len(self.memory))
        w0 = [w.to(state["memory_w0"].dtype) for w in self.memory]
        return TitansState(tuple(w0[l] + state[f"memory_w{l}"] for l in L),
                           tuple(state[f"memory_s{l}"] for l in L),
                           tuple(w0[l] + state[f"memory_c{l}"] for l in L), state["pos"])

    def _pack(self, memory: TitansState) -> dict:
        w0 = [w.to(memory.weights[0].dtype) for w in self.memory]
        packed = {}
        for layer, (w, s, c) in enumerate(zip(*memory[:3])):
            packed.update({f"memory_w{layer}": w - w0[layer], f"memory_s{layer}": s,
                           f"memory_c{layer}": c - w0[layer]})
        return packed

    def _memory(self, x: torch.Tensor, gates: torch.Tensor, state: dict | None):
        """The memory branch: its output (B, T, C) before the gate, the memory's new state and
        the convolution's (both None without a `state`, the flat generation dict)."""
        B, T, C = x.shape
        H, D = self.n_heads, self.head_dim
        fused = fused_conv_runs(self.kernel, self.fused_conv, x.device)
        q, k, v, conv_state = convolved_qkv(self.qkv(x), self.conv, state, H, fused)
        memory_state = None if state is None else self._unpack(state)
        # (B, T, H) each
        theta, alpha, eta = torch.sigmoid(gates + self.gate_bias).view(B, T, 3, H).unbind(2)
        if self.token_step is not None:
            # a chunk's summed step stays <= titans_max_step (ModelConfig.titans_max_step)
            theta = self.token_step * (1 - eta) * theta
        weights = list(self.memory)
        options = dict(kernel=self.kernel, chunk_size=self.chunk_size, grad_clip=self.grad_clip)
        if memory_state is not None and T == 1:
            o, memory_state = titans_memory_one_token(q[:, 0], k[:, 0], v[:, 0], theta[:, 0],
                                                      alpha[:, 0], eta[:, 0], weights,
                                                      memory_state, **options)
            o = o[:, None]
        else:
            o, memory_state = titans_memory(q, k, v, theta, alpha, eta, weights,
                                            initial_state=memory_state,
                                            output_final_state=memory_state is not None, **options)
        # (B, T, H, D); the norm's weight in o's dtype keeps bf16 on torch's fused kernel
        o = F.rms_norm(o, (D,), self.norm_weight.to(o.dtype), self.norm_eps)
        return self.out_proj(o.reshape(B, T, C)), memory_state, conv_state

    def forward(self, x: torch.Tensor, state: dict | None = None):
        params, mix = self.gate_proj(x).split(self.gate_widths, dim=-1)
        memory, memory_state, conv_state = self._memory(x, params, state)
        attn_state = None if state is None else {key: state[key] for key in ("k", "v", "pos")}
        if self.arrangement == "mag":
            attended, attn_state = self.attn(x, attn_state)
            gate = torch.sigmoid(mix)
            y = gate * attended + (1 - gate) * memory
        else:
            attended, attn_state = self.attn(x + memory, attn_state)
            y = memory + attended
        if state is None:
            return y, None
        conv = {} if conv_state is None else {"conv": conv_state}
        return y, {**attn_state, **self._pack(memory_state), **conv}
