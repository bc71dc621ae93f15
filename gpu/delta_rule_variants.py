"""Our delta rule under other choices of tile precision and of the diagonal-block inverse, against
fla in the same process: forward and forward+backward time, error against the float64 token loop,
and registers / spills of every compiled kernel.

    python3 gpu/delta_rule_variants.py

Variants: `dot_precision` "tf32" (float32 tiles in one tf32 product, the default for half inputs
before commit 20a1a07) or "bf16" (tiles and saved intermediates rounded to bfloat16, as fla does,
today's default for bfloat16 heads >= 64), and L's 16 x 16 diagonal blocks inverted by forward
substitution or by repeated squaring (`INVERSE_BY_SQUARING`); both passed per call as
`triton_chunk_delta_rule(precision=..., inverse_by_squaring=...)`.
"""
import itertools
import sys

import torch
import triton
import triton.testing

from ltm.bench.kernels import _optional, make_inputs
# the module that makes every launch choice of the chunked delta rule and launches its kernels
from ltm.kernels.delta_rule import chunk as module
from ltm.ops.delta_rule.naive import naive_delta_rule

SHAPES = [(8, 2048, 8, 128), (2, 8192, 8, 128), (8, 2048, 16, 64), (16, 1024, 12, 64)]
VARIANTS = list(itertools.product(("tf32", "bf16"), (False, True)))


def variant(precision: str, squaring: bool):
    """Our op under one variant: the launch options of every call."""
    def ours(x):
        return module.triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x.get("g"),
                                              precision=precision, inverse_by_squaring=squaring)[0]
    return ours


def ms_of(fn, x, backward: bool) -> float:
    if backward:
        do = torch.randn_like(fn(x))
        step = lambda: fn(x).backward(do)
    else:
        step = lambda: fn(x)
    step()
    grads = [t for t in x.values() if t.requires_grad]
    return triton.testing.do_bench(step, warmup=25, rep=150, grad_to_none=grads, return_mode="median")


def errors(ours, shape, strong: bool) -> str:
    """Relative errors of o and of each gradient against the float64 token loop (bf16 inputs)."""
    x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
    if strong:
        x["g"] = (-10 * torch.rand_like(x["g"])).detach().requires_grad_()
    o = ours(x)
    ref = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    o_ref = naive_delta_rule(ref["q"], ref["k"], ref["v"], ref["beta"], ref["g"])[0]
    do = torch.randn_like(o_ref)
    o.backward(do.to(o.dtype))
    o_ref.backward(do)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
    parts = [f"o {rel(o, o_ref):.1e}"] + [f"d{n} {rel(x[n].grad, ref[n].grad):.1e}" for n in x]
    return " ".join(parts)


def compiled_report() -> None:
    for name in ("_prep_fwd_kernel", "_fwd_kernel", "_output_kernel", "_bwd_local_kernel",
                 "_bwd_state_kernel", "_bwd_chunk_kernel"):
        fn = getattr(module, name)
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for compiled in kernels.values():
                meta = getattr(compiled, "metadata", None)
                print(f"   {name:20} regs {getattr(compiled, 'n_regs', '?'):>4} "
                      f"spills {getattr(compiled, 'n_spills', '?'):>5} "
                      f"smem {getattr(meta, 'shared', '?')}", flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    fla = _optional("fla.ops.delta_rule", "chunk_delta_rule")
    for precision, squaring in VARIANTS:
        ours = variant(precision, squaring)
        print(f"-- {precision} squaring={squaring}: errors B2-T300-H4-D128 weak: "
              f"{errors(ours, (2, 300, 4, 128), False)}; B1-T1000-H2-D64 strong: "
              f"{errors(ours, (1, 1000, 2, 64), True)}", flush=True)
    for shape in SHAPES:
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        if fla is not None:
            plain = {n: x[n] for n in ("q", "k", "v", "beta")}
            f = lambda x: fla(x["q"], x["k"], x["v"], x["beta"])[0]
            print(f"{str(shape):20} fla delta rule        fwd {ms_of(f, plain, False):7.3f} "
                  f"fwd+bwd {ms_of(f, plain, True):7.3f} ms", flush=True)
        for precision, squaring in VARIANTS:
            ours = variant(precision, squaring)
            print(f"{str(shape):20} ours {precision} sq={squaring!s:5}     fwd {ms_of(ours, x, False):7.3f} "
                  f"fwd+bwd {ms_of(ours, x, True):7.3f} ms", flush=True)
    compiled_report()
    if len(sys.argv) > 1:
        from profile_kernels import profile_impl
        x = make_inputs("gated_delta_rule", 8, 2048, 8, 128, torch.bfloat16, torch.device("cuda"))
        for precision, squaring in VARIANTS:
            profile_impl(f"ours {precision} squaring={squaring}", variant(precision, squaring), x)


if __name__ == "__main__":
    main()
