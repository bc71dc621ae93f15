"""s20 call 1: where the forward's host time goes on the GPU host (cProfile), and what a bare
Triton launch of ~25 arguments costs."""
import cProfile, io, pstats, sys, time
import torch, triton, triton.language as tl
sys.path.insert(0, ".")
from ltm.bench.kernels import implementations, make_inputs
sys.path.insert(0, "gpu")
from host_overhead import pass_fn, host_ms

dev = torch.device("cuda")

@triton.jit
def _many(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, T, H, HQ, K, V,
          scale, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, P: tl.constexpr,
          F1: tl.constexpr, F2: tl.constexpr, F3: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0:
        tl.store(a0, T * 1.0)

bufs = [torch.empty(16, device=dev) for _ in range(12)]
def launch_kw():
    _many[(1,)](a0=bufs[0], a1=bufs[1], a2=bufs[2], a3=bufs[3], a4=bufs[4], a5=bufs[5], a6=bufs[6],
                a7=bufs[7], a8=bufs[8], a9=bufs[9], a10=bufs[10], a11=bufs[11], T=8192, H=8, HQ=8,
                K=128, V=128, scale=0.1, BT=64, BK=128, BV=64, P="bf16", F1=True, F2=False, F3=True,
                num_warps=4, num_stages=2)
def launch_pos():
    _many[(1,)](*bufs, 8192, 8, 8, 128, 128, 0.1, 64, 128, 64, "bf16", True, False, True,
                num_warps=4, num_stages=2)
for name, f in (("kwargs", launch_kw), ("positional", launch_pos)):
    f(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(500): f()
        best = min(best, (time.perf_counter() - t0) / 500)
        torch.cuda.synchronize()
    print(f"bare Triton launch, 25 args, {name}: {best*1e6:.1f} us", flush=True)
def empties():
    for _ in range(7): torch.empty((2, 8192, 8, 128), dtype=torch.bfloat16, device=dev)
t0 = time.perf_counter()
for _ in range(500): empties()
print(f"7 torch.empty: {(time.perf_counter()-t0)/500*1e6:.1f} us", flush=True)

for op in sys.argv[1].split(","):
    impl = implementations(op, dev)["triton"]
    x = make_inputs(op, 2, 8192, 8, 128, torch.bfloat16, dev)
    for backward in (False, True):
        step = pass_fn(impl, x, backward)
        for _ in range(3): step()
        torch.cuda.synchronize()
        print(f"{op} {'fb' if backward else 'fwd'} host {min(host_ms(step) for _ in range(5))*1e3:.1f} us/call", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200): step()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        print(s.getvalue()[-5200:], flush=True)
