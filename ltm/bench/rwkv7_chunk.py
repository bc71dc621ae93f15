"""The chunked RWKV-7 kernel against the token-loop kernel and fla, bf16, forward and
forward+backward (triton.testing.do_bench medians), then where the chunked kernel's time goes.

    python3 gpu/rwkv7_chunk_bench.py [B,T,H,D ...]
"""
import sys

import torch
import triton
import triton.testing
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import _optional, make_inputs
from ltm.kernels.rwkv7 import triton_chunk_rwkv7, triton_fused_recurrent_rwkv7


def times(fn, args, grad) -> tuple[float, float]:
    fwd = triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=150)

    def once():
        fn(*args)[0].backward(grad)
    once()
    return fwd, triton.testing.do_bench(once, warmup=25, rep=150, grad_to_none=list(args))


def kernel_breakdown(args, grad) -> None:
    def once():
        triton_chunk_rwkv7(*args)[0].backward(grad)
    once()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            once()
        torch.cuda.synchronize()
    rows = sorted(((e.device_time_total / 5, e.key) for e in prof.key_averages()
                   if e.device_time_total > 0), reverse=True)
    print("   " + ", ".join(f"{key[:28]} {us / 1000:.3f} ms" for us, key in rows[:8]), flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    # fla first after ours (its first call autotunes for minutes), the slow token loop last
    impls = {"chunk": triton_chunk_rwkv7}
    fla = _optional("fla.ops.rwkv7", "chunk_rwkv7")
    if fla is not None:
        impls["fla"] = fla
    impls["loop"] = triton_fused_recurrent_rwkv7
    for text in sys.argv[1:] or ["8,2048,8,128"]:
        shape = tuple(int(n) for n in text.split(","))
        x = make_inputs("rwkv7", *shape, torch.bfloat16, torch.device("cuda"))
        args = [x[n] for n in ("r", "w", "k", "v", "a", "b")]
        grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        kernel_breakdown(args, grad)
        result = {}
        for name, fn in impls.items():
            fwd, both = result[name] = times(fn, args, grad)
            ratio = f"  fla / chunk {both / result['chunk'][1]:.2f}x" if name == "fla" else ""
            print(f"{name:6s} {text:14s} fwd {fwd:8.3f} ms  fwd+bwd {both:8.3f} ms{ratio}", flush=True)


if __name__ == "__main__":
    main()
