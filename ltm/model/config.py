"""The model's configuration, `ModelConfig` (the `model:` section of params.yaml), with its checks.

A module of its own so that the model (ltm/model/lm.py) and its token mixers (ltm/model/mixers.py) both
import it without importing each other; `from ltm.model.lm import ModelConfig` still works.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

from ltm.ops import KERNEL_CHOICES
from ltm.ops.titans.memory import triton_chunk_sizes
from ltm.params import check

# the Titans gates' initial values (ltm/model/titans.py): small steps, little forgetting, weak
# momentum. Momentum starting at 0.9 carried each key's write into the next keys' and kept the
# memory from learning associative recall at the benchmark's budget (0.06 beyond the window,
# chance 0.03; 0.12 from 0.1: LOG.md, 2026-11-27, sixth session); the model can still learn a
# strong momentum
TITANS_THETA_INIT, TITANS_ALPHA_INIT, TITANS_ETA_INIT = 0.1, 0.01, 0.1
# with titans_max_step, theta's sigmoid starts here instead (theta = 3/4 of its bound)
TITANS_THETA_SIGMOID_INIT = 0.75
# titans_max_step auto, by titans_depth (2: any deeper memory): the linear memory's Hessian is 1
# (unit keys), so 1.0 is half the edge (1 + the chunk's forgetting, about 1.9); unbounded, its
# chunks of 16 trained to 5.0-5.8 nats on real text where 1.0 and 0.4 reached 4.08-4.15 (GPU
# profile, 300 steps, 3 seeds; LOG.md 2026-12-06). A deep chunk's Hessian reached 3-4, so 0.4
# keeps step x curvature under 1.9 up to 4.75
STEP_BOUND_AUTO = {1: 1.0, 2: 0.4}
# titans_chunk_size auto, by titans_depth: with its bound the linear memory at chunk 64 was as good
# as at 16 on real text (4.070 against 4.095 nats, 3 seeds) and trained 1.17-1.4x faster on the
# GPU profile (LOG.md 2026-12-06). The deep memory's kernel takes 16 or 32, and its time is the
# chain of chunks in turn (heads of 16 keep a third of the time of heads of 64; LOG.md
# 2026-12-07, tenth session): at 32, half the chunks. There the CPU default's loss was 0.010 +-
# 0.003 nats lower (3 seeds) and the recall margin 0.045 +- 0.017 against 0.048 +- 0.013
CHUNK_AUTO = {1: 64, 2: 32}


@dataclasses.dataclass
class ModelConfig:
    """The `model:` section of params.yaml. Defaults: a tiny model that trains on a CPU."""

    # 0 = taken from the tokenizer by the train stage; must be > 0 to build a model
    vocab_size: int = 0
    # token mixer of every layer
    mixer: Literal["attention", "rwkv7", "deltanet", "titans"] = "attention"
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    # hidden width of the SwiGLU MLP; null = 8/3 * d_model rounded up to a multiple of 64
    d_ff: int | None = None
    # longest sequence: size of the RoPE table and of the KV cache
    max_seq_len: int = 256
    # attention only: each token sees itself and window - 1 earlier tokens; null = all
    window: int | None = None
    # implementation of the linear recurrences: naive (token by token), torch (chunked),
    # triton (our kernels), fla (flash-linear-attention, if installed) or auto (per op and shape,
    # the fastest of triton and fla measured on this GPU, ltm/ops/auto.py; torch on a CPU)
    kernel: Literal["naive", "torch", "triton", "fla", "auto"] = "torch"
    # tokens per chunk of the chunked forms
    chunk_size: int = 64
    # deltanet and titans: depthwise causal convolution of width conv_size on q, k, v
    short_conv: bool = True
    conv_size: int = 4
    # deltanet and titans with kernel triton, training: convolution, SiLU and the q, k norms in one Triton op
    fused_conv: bool = True
    # deltanet: a fast and a slow state per head, mixed by a learned gate
    hierarchical: bool = False
    # hierarchical deltanet, the roadmap's switches (ltm/ops/dual_delta_rule/step.py defines them):
    # stacked = the plain delta rule on q, k, v concatenated twice; dual = both states in one op
    # reading q, k, v once (same function); the two variants below always run the dual op
    hier_op: Literal["stacked", "dual"] = "stacked"
    # fast/slow output mix: gate = learned sigmoid gate per token and head; sum = fast + slow
    hier_mix: Literal["gate", "sum"] = "gate"
    # token = the fast state read at every token; chunk = read only as it stood at the last chunk
    # boundary (no intra-chunk attention; chunks of chunk_size from position 0)
    hier_fast_read: Literal["token", "chunk"] = "token"
    # event-driven slow state: a chunk's update is kept only if its surprise (sum |delta|^2 /
    # sum |beta v|^2) is >= this; null = always kept
    hier_slow_threshold: float | None = None
    # deltanet: q, k, v and the gates projected by one matmul (one weight read as two)
    fused_proj: bool = False
    # titans: the neural long-term memory (ltm/ops/titans) beside sliding-window attention;
    # mag = both read x, mixed by a learned gate; mal = the memory layer, then attention on it
    titans_arrangement: Literal["mag", "mal"] = "mag"
    # titans: layers of each head's memory; 1 = linear (a delta rule with momentum and forgetting),
    # >= 2 = an MLP of hidden width titans_expansion * head_dim (SiLU)
    titans_depth: int = 2
    titans_expansion: int = 2
    # titans: the attention beside the memory sees itself and titans_window - 1 earlier tokens
    titans_window: int = 64
    # titans: tokens per mini-batch of the memory's test-time gradient descent, whose gradients are
    # all taken at the mini-batch's starting weights; part of the model's function (unlike
    # chunk_size), 1 = exact per-token steps; auto = CHUNK_AUTO by titans_depth
    titans_chunk_size: int | Literal["auto"] = "auto"
    # titans: each token's memory gradient clipped to this norm (deep memories diverge without);
    # null = no clipping
    titans_grad_clip: float | None = 1.0
    # titans: the memory's step added up over a chunk, titans_chunk_size * theta / (1 - eta) (eta:
    # momentum), is at most this: theta = titans_max_step / titans_chunk_size * (1 - eta) *
    # sigmoid(.). A chunk's gradients are all taken at its starting weights, so the chunk takes
    # one gradient step of that summed size, stable while it times the largest eigenvalue of the
    # chunk's loss Hessian stays under about 2: 1 for the linear memory's unit keys, 3-4 for the
    # depth-2 memory on the GPU profile at T 8192, whose chunks overshot (state Jacobian
    # eigenvalues -2 to -3) and whose gradient grew 1e3x per 512 tokens to nan (LOG.md,
    # 2026-11-29). auto = STEP_BOUND_AUTO by depth: 1.0 for the linear memory (unbounded, a
    # chunk's summed step reaches 16 / (1 - eta)), 0.4 for deeper ones; null = theta = sigmoid(.),
    # unbounded (starting at 0.1)
    titans_max_step: float | Literal["auto"] | None = "auto"
    # latent thought vectors per layer (0 = a plain language model)
    n_latent: int = 0
    # RMS-normalise each latent before its cross-attention's keys and values (then a global scale
    # of z reaches the decoder only through the norm's eps); false = z enters raw, as the LTM
    # authors feed it
    latent_norm: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # recompute each block in the backward pass instead of storing its activations
    checkpointing: bool = False
    # std of the normal init of linear and embedding weights
    init_std: float = 0.02

    def __post_init__(self):
        check(self.vocab_size >= 0, "vocab_size", f"must be >= 0, got {self.vocab_size}")
        check(self.mixer in ("attention", "rwkv7", "deltanet", "titans"), "mixer",
              f"expected 'attention', 'rwkv7', 'deltanet' or 'titans', got {self.mixer!r}")
        check(self.n_layers >= 1, "n_layers", f"must be >= 1, got {self.n_layers}")
        check(self.n_heads >= 1, "n_heads", f"must be >= 1, got {self.n_heads}")
        check(self.d_model >= 1 and self.d_model % self.n_heads == 0, "d_model",
              f"must be a positive multiple of n_heads={self.n_heads}, got {self.d_model}")
        check(self.mixer not in ("attention", "titans") or (self.d_model // self.n_heads) % 2 == 0,
              "d_model", f"attention needs an even head size for RoPE, got d_model / n_heads = "
              f"{self.d_model // self.n_heads}")
        check(self.d_ff is None or self.d_ff >= 1, "d_ff", f"must be >= 1 or null, got {self.d_ff}")
        check(self.max_seq_len >= 1, "max_seq_len", f"must be >= 1, got {self.max_seq_len}")
        check(self.window is None or self.window >= 1, "window",
              f"must be >= 1 or null, got {self.window}")
        check(self.window is None or self.mixer == "attention", "window",
              f"applies to mixer 'attention' only, set it to null for mixer {self.mixer!r}")
        check(self.kernel in KERNEL_CHOICES, "kernel",
              f"expected 'naive', 'torch', 'triton', 'fla' or 'auto', got {self.kernel!r}")
        check(self.chunk_size >= 1, "chunk_size", f"must be >= 1, got {self.chunk_size}")
        check(self.conv_size >= 2, "conv_size", f"must be >= 2, got {self.conv_size}")
        check(not self.hierarchical or self.mixer == "deltanet", "hierarchical",
              f"applies to mixer 'deltanet' only, not {self.mixer!r}")
        check(self.hier_op in ("stacked", "dual"), "hier_op",
              f"expected 'stacked' or 'dual', got {self.hier_op!r}")
        check(self.hier_mix in ("gate", "sum"), "hier_mix",
              f"expected 'gate' or 'sum', got {self.hier_mix!r}")
        check(self.hier_fast_read in ("token", "chunk"), "hier_fast_read",
              f"expected 'token' or 'chunk', got {self.hier_fast_read!r}")
        check(self.hier_slow_threshold is None or self.hier_slow_threshold >= 0,
              "hier_slow_threshold", f"must be >= 0 or null, got {self.hier_slow_threshold}")
        self._check_titans()
        check(self.n_latent >= 0, "n_latent", f"must be >= 0, got {self.n_latent}")
        check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
        check(self.norm_eps > 0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        check(self.init_std > 0, "init_std", f"must be > 0, got {self.init_std}")

    def _check_titans(self) -> None:
        check(self.titans_arrangement in ("mag", "mal"), "titans_arrangement",
              f"expected 'mag' or 'mal', got {self.titans_arrangement!r}")
        for name in ("titans_depth", "titans_expansion", "titans_window"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        chunk = self.titans_chunk_size
        check(chunk == "auto" or (isinstance(chunk, int) and chunk >= 1), "titans_chunk_size",
              f"must be >= 1 or auto, got {chunk!r}")
        check(self.titans_grad_clip is None or self.titans_grad_clip > 0, "titans_grad_clip",
              f"must be > 0 or null, got {self.titans_grad_clip}")
        check(self.titans_max_step in (None, "auto") or self.titans_max_step > 0,
              "titans_max_step", f"must be > 0, auto or null, got {self.titans_max_step!r}")
        if self.mixer != "titans":
            return
        sizes = triton_chunk_sizes(self.titans_depth)
        check(self.kernel != "triton" or self.titans_chunk in sizes, "kernel",
              "mixer 'titans' runs Triton only with titans_depth 1 and titans_chunk_size in "
              f"{triton_chunk_sizes(1)} or titans_depth 2 and titans_chunk_size in "
              f"{triton_chunk_sizes(2)} (got titans_depth {self.titans_depth}, titans_chunk_size "
              f"{self.titans_chunk}); use torch")
        exact = (self.titans_depth == 1 and self.titans_chunk == 1
                 and self.titans_grad_clip is None)
        check(self.kernel != "fla" or exact, "kernel",
              "fla computes the titans memory only with titans_depth 1, titans_chunk_size 1 and "
              "titans_grad_clip null; use torch")

    @property
    def titans_chunk(self) -> int:
        """titans_chunk_size resolved: auto by titans_depth (CHUNK_AUTO)."""
        if self.titans_chunk_size != "auto":
            return self.titans_chunk_size
        return CHUNK_AUTO[min(self.titans_depth, 2)]

    @property
    def titans_step_bound(self) -> float | None:
        """titans_max_step resolved: auto by titans_depth (STEP_BOUND_AUTO)."""
        if self.titans_max_step != "auto":
            return self.titans_max_step
        return STEP_BOUND_AUTO[min(self.titans_depth, 2)]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """Width of the SwiGLU MLP."""
        if self.d_ff is not None:
            return self.d_ff
        return 64 * math.ceil(8 * self.d_model / 3 / 64)
