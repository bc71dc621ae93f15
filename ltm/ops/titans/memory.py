"""What every form of the Titans memory shares: its state, the memory network M, the explicit
gradient of the associative loss, and the input checks.

The memory of one head is a stack of L weights W_1 [K, E], ..., W_L [E, V] (L = 1: the linear
memory M(x) = W^T x; L >= 2: an MLP with SiLU between layers and no residual, so that zero last
weights read zero like the linear memory's zero state):

    h_0 = x;  z_l = h_{l-1} W_l;  h_l = silu(z_l) (l < L);  M(x) = z_L

The gradient of l(M) = 1/2 ||M(k) - v||^2 is, layer by layer, a rank-one outer product
x_l delta_l^T: x_l = h_{l-1} the layer's input, delta_L = M(k) - v and
delta_l = (delta_{l+1} W_{l+1}^T) * silu'(z_l). Every form below uses this, so each token's update
of a layer is rank one whatever the depth.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F


# chunk sizes the Triton kernel (ltm.kernels.titans) takes: tl.dot's tiles are at least 16 a side,
# and a (BT, BT) score tile beside four [K, V] states in registers leaves no room above 64
TRITON_CHUNK_SIZES = (16, 32, 64)
# the deep memory's kernel (two layers): its programs hold several (BT, BT) tiles beside the hidden
# tiles; 64 was never tried on a GPU
TRITON_DEEP_CHUNK_SIZES = (16, 32)


def triton_chunk_sizes(depth: int) -> tuple[int, ...]:
    """The chunk sizes the Triton kernels take for a memory of `depth` layers (none past 2)."""
    return {1: TRITON_CHUNK_SIZES, 2: TRITON_DEEP_CHUNK_SIZES}.get(depth, ())


class TitansState(NamedTuple):
    """The per-sequence state after `pos` tokens; every tensor is [B, H, d_in, d_out] per layer,
    float32 (float64 for float64 inputs)."""

    # the memory's weights after the last token
    weights: tuple[torch.Tensor, ...]
    # the momentum ("surprise") S of each weight
    momenta: tuple[torch.Tensor, ...]
    # the weights at the start of the current chunk, where its tokens' gradients are taken (equal
    # to `weights` when pos is a multiple of the chunk size): a prefill or step that starts inside
    # a chunk continues its mini-batch exactly
    chunk_weights: tuple[torch.Tensor, ...]
    # tokens consumed so far: chunks are counted from position 0. The one-token step also takes
    # a (B,) integer tensor, each row at its own position (static-cache decoding of ragged
    # prompts); the sequence forms need an int (their chunk boundaries are Python-level)
    pos: int | torch.Tensor


def init_titans_state(weights: Sequence[torch.Tensor], batch: int,
                      dtype: torch.dtype | None = None) -> TitansState:
    """The state before the first token: each sequence starts from the shared initial weights
    ([H, d_in, d_out] per layer), with zero momentum."""
    dtype = dtype or torch.promote_types(weights[0].dtype, torch.float32)
    start = tuple(w.to(dtype).unsqueeze(0).expand(batch, *w.shape) for w in weights)
    return TitansState(start, tuple(w.new_zeros(w.shape) for w in start), start, 0)


def memory_read(weights: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """M(x): x [..., n, d_in] through the weights [..., d_in, d_out] (same leading dims)."""
    h = x
    for layer, w in enumerate(weights):
        h = h @ w
        if layer < len(weights) - 1:
            h = F.silu(h)
    return h


def silu_grad(z: torch.Tensor) -> torch.Tensor:
    """d silu(z) / dz, written out so that the outer autograd differentiates it once more."""
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


def memory_grads(weights: Sequence[torch.Tensor], k: torch.Tensor, v: torch.Tensor,
                 grad_clip: float | None) -> tuple[list, list, torch.Tensor]:
    """The per-token gradients of 1/2 ||M(k) - v||^2 at `weights` as rank-one factors.

    k [B, H, n, K], v [B, H, n, V], weights [B, H, d_in, d_out] per layer. Returns the inputs x_l
    [B, H, n, d_in] and the deltas delta_l [B, H, n, d_out] of every layer (the gradient of W_l
    for token t is x_l[t] delta_l[t]^T) and each token's clip factor [B, H, n]: min(1, grad_clip
    / ||grad||), the norm over all layers, 1 when grad_clip is None.
    """
    inputs, pre = [k], []
    h = k
    for layer, w in enumerate(weights):
        z = h @ w
        pre.append(z)
        if layer < len(weights) - 1:
            h = F.silu(z)
            inputs.append(h)
    delta = pre[-1] - v
    deltas = [delta]
    for layer in range(len(weights) - 1, 0, -1):
        delta = (delta @ weights[layer].transpose(-1, -2)) * silu_grad(pre[layer - 1])
        deltas.insert(0, delta)
    if grad_clip is None:
        return inputs, deltas, torch.ones_like(k[..., 0])
    # ||x delta^T||_F^2 = |x|^2 |delta|^2: no outer product is formed
    norm_sq = sum(x.square().sum(-1) * d.square().sum(-1) for x, d in zip(inputs, deltas))
    # clip / sqrt(max(|g|^2, clip^2)), not min(1, clip / |g|): no sqrt at |g| = 0, whose
    # derivative (infinite) would turn a zero gradient into NaN
    return inputs, deltas, grad_clip * torch.rsqrt(norm_sq.clamp_min(grad_clip ** 2))


def _shape(x: torch.Tensor) -> tuple:
    return tuple(x.shape)


def check_weights(weights: Sequence[torch.Tensor], H: int, K: int, V: int) -> None:
    """One-line errors unless `weights` is a chain [H, K, E1], [H, E1, E2], ..., [H, E, V]."""
    if not isinstance(weights, (list, tuple)) or len(weights) == 0:
        raise ValueError("weights must be a non-empty sequence of [H, d_in, d_out] tensors")
    d_in = K
    for layer, w in enumerate(weights):
        d_out = V if layer == len(weights) - 1 else w.shape[-1]
        if w.dim() != 3 or _shape(w) != (H, d_in, d_out):
            raise ValueError(f"weights[{layer}] must be [H, d_in, d_out] = {(H, d_in, d_out)} "
                             f"(a chain from K={K} to V={V}), got {_shape(w)}")
        d_in = d_out


def check_state(state: TitansState | None, weights: Sequence[torch.Tensor], B: int,
                tensor_pos: bool = False) -> None:
    """One-line errors for a state of the wrong kind or shapes; a (B,) tensor position only
    where `tensor_pos` (the one-token step)."""
    if state is None:
        return
    if not isinstance(state, TitansState):
        raise ValueError("state must be a TitansState (see init_titans_state) or None")
    if torch.is_tensor(state.pos):
        if not tensor_pos or tuple(state.pos.shape) != (B,) or state.pos.is_floating_point():
            raise ValueError(f"state.pos must be an int{' or a (B,) integer tensor' * tensor_pos}"
                             f", got a tensor of shape {tuple(state.pos.shape)}")
    elif not isinstance(state.pos, int) or state.pos < 0:
        raise ValueError(f"state.pos must be an int >= 0, got {state.pos!r}")
    for name in ("weights", "momenta", "chunk_weights"):
        got = getattr(state, name)
        want = [(B, *w.shape) for w in weights]
        if len(got) != len(weights) or [_shape(x) for x in got] != want:
            raise ValueError(f"state.{name} must be [B, H, d_in, d_out] per layer = {want}, "
                             f"got {[_shape(x) for x in got]}")


def check_options(chunk_size: int, grad_clip: float | None) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip!r}")


def check_inputs(q, k, v, theta, alpha, eta, weights, state, chunk_size, grad_clip,
                 tensor_pos: bool = False) -> None:
    """One-line ValueErrors for a sequence: q, k [B, T, H, K]; v [B, T, H, V]; theta, alpha,
    eta [B, T, H]; T >= 1."""
    if q.dim() != 4 or q.shape[1] < 1:
        raise ValueError(f"q must be [B, T, H, K] with T >= 1, got shape {_shape(q)}")
    B, T, H, K = q.shape
    if _shape(k) != _shape(q):
        raise ValueError(f"k must be [B, T, H, K] = {(B, T, H, K)} like q, got {_shape(k)}")
    if v.dim() != 4 or _shape(v)[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {(B, T, H)}, got {_shape(v)}")
    for name, x in (("theta", theta), ("alpha", alpha), ("eta", eta)):
        if _shape(x) != (B, T, H):
            raise ValueError(f"{name} must be [B, T, H] = {(B, T, H)}, got {_shape(x)}")
    check_weights(weights, H, K, v.shape[-1])
    check_state(state, weights, B, tensor_pos)
    check_options(chunk_size, grad_clip)
