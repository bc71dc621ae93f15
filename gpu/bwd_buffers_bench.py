"""The delta rule's backward buffers in float32 or in the tiles' dtype (`BWD_BUFFERS` in
`ltm.kernels.delta_rule.chunk`, chosen per call by `triton_chunk_delta_rule(bwd_buffers=...)`):
forward+backward time and the GPU time of each backward kernel per choice, at shapes where the
backward is heavy, one process.

    python3 gpu/bwd_buffers_bench.py ["B,T,H,D;..."]

A row per (shape, choice): do_bench median of one forward+backward (bf16), then the kernels' CUDA
time from torch.profiler (10 passes), and the relative error of the gradients against the
float32 choice (so a choice that changes results shows).
"""
import itertools
import sys

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from ltm.bench.kernels import make_inputs
from ltm.kernels.delta_rule import chunk as module

SHAPES = [(2, 32768, 8, 128), (32, 2048, 4, 128), (8, 8192, 32, 64), (8, 2048, 8, 128)]
CHOICES = [dict(zip(("dd", "dh_local", "dh"), c)) for c in itertools.product(("f32", "mid"), repeat=3)]


def fwd_bwd(x, do, choice):
    o = module.triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], bwd_buffers=choice)[0]
    o.backward(do)


def kernel_ms(x, do, choice) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fwd_bwd(x, do, choice)
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / 10 / 1000, 3) for e in prof.key_averages()
            if e.key.startswith("_bwd")}


def main():
    shapes = ([tuple(int(n) for n in s.split(",")) for s in sys.argv[1].split(";")]
              if len(sys.argv) > 1 else SHAPES)
    for shape in shapes:
        x = make_inputs("gated_delta_rule", *shape, torch.bfloat16, torch.device("cuda"))
        do = torch.randn(*shape[:3], shape[3], dtype=torch.bfloat16, device="cuda")
        grads = [t for t in x.values() if t.requires_grad]
        reference = None
        for choice in CHOICES:
            for t in grads:
                t.grad = None
            fwd_bwd(x, do, choice)
            got = [t.grad.float().clone() for t in grads]
            reference = reference or got
            err = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, reference))
            ms = triton.testing.do_bench(lambda: fwd_bwd(x, do, choice), warmup=25, rep=100,
                                         grad_to_none=grads, return_mode="median")
            print(f"{','.join(map(str, shape)):15s} {choice}  fwd+bwd {ms:7.3f} ms  "
                  f"max grad diff vs f32 {err:.1e}  {kernel_ms(x, do, choice)}", flush=True)


if __name__ == "__main__":
    main()
