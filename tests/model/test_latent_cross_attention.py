"""The latent cross-attention (ltm.model.lm.LatentCrossAttention) against a float64 loop written
from its definition, one head, one token and one latent at a time: softmax over the latents of
q . k / sqrt(head_dim), values weighted by it, heads concatenated, then the output projection;
forward and the gradients of the input, the latents and every weight, with and without the latents'
RMSNorm. Keys and values swapped, a wrong scale or a mask would fail it."""
import math

import pytest
import torch

from ltm.model.lm import LatentCrossAttention, ModelConfig


def reference(module: LatentCrossAttention, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The block's output (B, T, C) by loops, float64."""
    H, D = module.n_heads, module.head_dim
    if module.latent_norm is not None:
        w, eps = module.latent_norm.weight, module.latent_norm.eps
        z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps) * w
    wq, wkv, wo = module.q_proj.weight, module.kv_proj.weight, module.out_proj.weight
    C = wq.shape[0]
    wk, wv = wkv[:C], wkv[C:]  # kv_proj's output is keys then values, each (H, D) per latent
    out = []
    for b in range(x.shape[0]):
        rows = []
        for t in range(x.shape[1]):
            heads = []
            for h in range(H):
                part = slice(h * D, (h + 1) * D)
                q = wq[part] @ x[b, t]  # (D,)
                scores = torch.stack([q @ (wk[part] @ z[b, j]) for j in range(z.shape[1])]) / math.sqrt(D)
                weights = torch.softmax(scores, dim=0)
                heads.append(sum(weights[j] * (wv[part] @ z[b, j]) for j in range(z.shape[1])))
            rows.append(wo @ torch.cat(heads))
        out.append(torch.stack(rows))
    return torch.stack(out)


@pytest.mark.parametrize("latent_norm", [True, False])
def test_the_cross_attention_matches_a_float64_loop_forward_and_backward(latent_norm):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=11, d_model=12, n_heads=3, n_latent=5, latent_norm=latent_norm)
    module = LatentCrossAttention(cfg).double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))  # the norm's unit weight too
    x = torch.randn(2, 7, 12, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    got = module(x, module.latent_kv(z))
    want = reference(module, x, z)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    weights = torch.randn_like(got)
    inputs = [x, z, *module.parameters()]
    grads_got = torch.autograd.grad((got * weights).sum(), inputs)
    grads_want = torch.autograd.grad((want * weights).sum(), inputs)
    for g, w in zip(grads_got, grads_want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)
