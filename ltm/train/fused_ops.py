"""`train.opt.fused_ops`: fused kernels for the layer's elementwise work and the loss, swapped into
a built model module by module (the weights, their names and the maths stay; only rounding moves).

    rms_norm       our Triton RMSNorm (forward and backward, one pass over each row)
    swiglu         our Triton SiLU(gate) * up, reading the packed (N, 2 * hidden) gate_up output
                   and writing its gradient packed: no chunk, no copies, no cat in the backward
    rope           Liger-Kernel's rotary embedding of q and k (attention)
    cross_entropy  Liger-Kernel's fused linear cross-entropy: the head matmul and the loss in
                   chunks, no full-vocabulary logits, gradients accumulated in float32

Why ours for two of them: Liger's SwiGLU kernel needs gate and up as two contiguous tensors (our
gate_up.chunk gives strided halves, so each would be copied first and the gradient concatenated),
and neither Liger's SwiGLU nor its RMSNorm runs under Triton's interpreter (they call .to on
scalar arguments), so they could not be checked on a CPU. Liger's RoPE and fused linear
cross-entropy fit our layout as they are and run under the interpreter.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from ltm.model.cross_entropy import linear_cross_entropy
from ltm.model.lm import RMSNorm, SwiGLU
from ltm.model.mixers import Attention, apply_rope, rope_tables
from ltm.params import ParamsError
from ltm.train.settings import FUSED_OPS

LIGER_OPS = ("rope", "cross_entropy")


def check_fused_ops(ops) -> None:
    unknown = [op for op in ops if op not in FUSED_OPS]
    if unknown:
        raise ParamsError(f"train.opt.fused_ops: unknown {unknown}; expected some of {list(FUSED_OPS)}")
    if any(op in LIGER_OPS for op in ops) and importlib.util.find_spec("liger_kernel") is None:
        raise ParamsError("train.opt.fused_ops: rope and cross_entropy need liger-kernel "
                          "(pip install liger-kernel, see requirements.txt)")


# --- RMSNorm ------------------------------------------------------------------------------

@triton.jit
def _rms_norm_fwd(X, W, Y, RSTD, stride, C, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    tl.store(Y + row * C + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_bwd(X, W, DY, DX, RSTD, DW, stride, N, C, n_programs, BLOCK: tl.constexpr):
    """Each program takes rows pid, pid + n_programs, ...; its share of dW goes to row pid of DW
    (n_programs, C), summed afterwards."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, N, n_programs):
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * C + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        g = dy * w
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=0) / C))
        tl.store(DX + row * C + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW + pid * C + cols, dw, mask=mask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        N, C = x2.shape
        y = torch.empty((N, C), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
        rstd = torch.empty(N, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(C)
        _rms_norm_fwd[(N,)](x2, weight, y, rstd, x2.stride(0), C, eps, BLOCK=block)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape, ctx.block, ctx.x_dtype = shape, block, x.dtype
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        N, C = x2.shape
        dy = dy.reshape(N, C).contiguous()
        dx = torch.empty((N, C), dtype=ctx.x_dtype, device=x2.device)
        n_programs = max(1, min(N, 4 * _sm_count(x2.device)))
        dw = torch.empty((n_programs, C), dtype=torch.float32, device=x2.device)
        _rms_norm_bwd[(n_programs,)](x2, weight, dy, dx, rstd, dw, x2.stride(0), N, C, n_programs,
                                     BLOCK=ctx.block)
        return dx.view(ctx.shape), dw.sum(0).to(weight.dtype), None


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: few programs, each looping over many rows


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm(x, (C,), weight, eps) in one Triton pass (float32 inside); x (..., C)."""
    return _RMSNorm.apply(x, weight, eps)


# --- SwiGLU -------------------------------------------------------------------------------

@triton.jit
def _swiglu_fwd(GU, H, stride, F_, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F_
    g = tl.load(GU + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride + F_ + cols, mask=mask, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u
    tl.store(H + row * F_ + cols, h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(GU, DH, DGU, stride, F_, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F_
    g = tl.load(GU + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride + F_ + cols, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(DH + row * F_ + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = dh * u * s * (1.0 + g * (1.0 - s))
    du = dh * g * s
    tl.store(DGU + row * 2 * F_ + cols, dg.to(DGU.dtype.element_ty), mask=mask)
    tl.store(DGU + row * 2 * F_ + F_ + cols, du.to(DGU.dtype.element_ty), mask=mask)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        shape = gate_up.shape
        gu = gate_up.reshape(-1, shape[-1])
        if gu.stride(-1) != 1:
            gu = gu.contiguous()
        N, F2 = gu.shape
        h = torch.empty((N, F2 // 2), dtype=gu.dtype, device=gu.device)
        block = min(1024, triton.next_power_of_2(F2 // 2))
        grid = (N, triton.cdiv(F2 // 2, block))
        _swiglu_fwd[grid](gu, h, gu.stride(0), F2 // 2, BLOCK=block)
        ctx.save_for_backward(gu)
        ctx.shape, ctx.block = shape, block
        return h.view(*shape[:-1], F2 // 2)

    @staticmethod
    def backward(ctx, dh):
        (gu,) = ctx.saved_tensors
        N, F2 = gu.shape
        dh = dh.reshape(N, F2 // 2).contiguous()
        dgu = torch.empty((N, F2), dtype=gu.dtype, device=gu.device)
        grid = (N, triton.cdiv(F2 // 2, ctx.block))
        _swiglu_bwd[grid](gu, dh, dgu, gu.stride(0), F2 // 2, BLOCK=ctx.block)
        return dgu.view(ctx.shape)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the packed gate_up (..., 2F) = [gate | up] -> (..., F)."""
    return _SwiGLU.apply(gate_up)


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# --- Liger's RoPE (its fused linear cross-entropy is in ltm.model.cross_entropy) --------------------------------------------

def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q, k (B, H, T, D) rotated as ltm.model.mixers.apply_rope does (halves, not interleaved pairs),
    by Liger's kernel; cos, sin (T, D / 2)."""
    # Liger-Kernel is optional (train.opt.fused_ops rope): imported when asked for
    from liger_kernel.ops.rope import LigerRopeFunction
    full_cos = torch.cat([cos, cos], dim=-1).to(q.dtype)[None]  # (1, T, D)
    full_sin = torch.cat([sin, sin], dim=-1).to(q.dtype)[None]
    return LigerRopeFunction.apply(q, k, full_cos, full_sin)


# --- swapping the modules ------------------------------------------------------------------

def apply_fused_ops(model: nn.Module, ops) -> int:
    """Swap the model's RMSNorm / SwiGLU / Attention modules for the fused subclasses of `ops`
    (in place; cross_entropy is the loss's, see ltm.train.objective.LossModel). Returns the modules swapped."""
    check_fused_ops(ops)
    swaps = {RMSNorm: ("rms_norm", FusedRMSNorm), SwiGLU: ("swiglu", FusedSwiGLU),
             Attention: ("rope", FusedRopeAttention)}
    count = 0
    for module in model.modules():
        op, fused = swaps.get(type(module), (None, None))
        if op in ops:
            module.__class__ = fused
            count += 1
    return count


class FusedRMSNorm(RMSNorm):
    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class FusedSwiGLU(SwiGLU):
    def forward(self, x):
        return self.out_proj(swiglu(self.gate_up(x)))


class FusedRopeAttention(Attention):
    def forward(self, x, state=None):
        if state is not None:  # generation: the reference path
            return super().forward(x, state)
        B, T, C = x.shape
        if T > self.max_seq_len:
            raise ValueError(f"x: position {T} is past model.max_seq_len={self.max_seq_len}")
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rope(q, k, self.cos[:T], self.sin[:T])
        y = self._attend(q, k, v, 0, 0)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C)), None


# --- the checks a GPU run repeats -------------------------------------------------------

def _max_rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def check_fused_against_references(device: str) -> list[dict]:
    """Each fused op against its plain PyTorch reference on odd shapes, the outputs and the input
    gradients: one row per op and dtype with the largest relative error and its bound (float32
    1e-5; bfloat16 2e-2, CUDA only). What `gpu/levers_bench.py --parts kernels` runs on a GPU."""
    cos, sin = (t.to(device) for t in rope_tables(64, 512, 10000.0))
    targets = torch.randint(0, 1037, (301,), device=device)  # the loss check's classes
    cases = {
        "rms_norm": (lambda x, w: rms_norm(x, w, 1e-6), lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
                     [(3, 77, 771), (771,)]),
        "swiglu": (swiglu, swiglu_reference, [(3, 77, 2 * 683)]),
        "rope": (lambda q, k: rope(q, k, cos[:77], sin[:77]),
                 lambda q, k: (apply_rope(q, cos[:77], sin[:77]), apply_rope(k, cos[:77], sin[:77])),
                 [(2, 5, 77, 64), (2, 5, 77, 64)]),
        "cross_entropy": (lambda h, w: linear_cross_entropy(h, w, targets, -100),
                          lambda h, w: F.cross_entropy((h @ w.t()).float(), targets),
                          [(301, 96), (1037, 96)]),
    }
    rows = []
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        if dtype == torch.bfloat16 and device == "cpu":
            continue
        for name, (fused, reference, shapes) in cases.items():
            gen = torch.Generator(device).manual_seed(0)
            inputs = [torch.randn(s, device=device, generator=gen).to(dtype) for s in shapes]
            outs = []
            for fn in (fused, reference):
                leaves = [t.clone().requires_grad_(True) for t in inputs]
                out = fn(*leaves)
                out = out if isinstance(out, tuple) else (out,)
                g = torch.Generator(device).manual_seed(1)
                sum((o.float() * torch.randn(o.shape, device=device, generator=g)).sum()
                    for o in out).backward()
                outs.append(list(out) + [t.grad for t in leaves])
            errors = [_max_rel_error(a, b) for a, b in zip(*outs)]
            rows.append({"op": name, "dtype": str(dtype).split(".")[-1], "max_rel_error": max(errors),
                         "bound": bound, "ok": max(errors) <= bound})
    return rows
