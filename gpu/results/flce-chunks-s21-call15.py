"""s21: the head + loss, forward+backward, at GPT-2 small's shape: compiled plain loss against
Liger's fused linear cross-entropy by chunk budget (chunk_mem_const) and accumulation dtype."""
import torch, triton, triton.testing
import torch.nn.functional as F
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as L
M, H, V = 16384, 768, 50304
torch.manual_seed(0)
h = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = (0.02 * torch.randn(V, H, device="cuda")).requires_grad_(True)
t = torch.randint(0, V, (M,), device="cuda")
plain = torch.compile(lambda h, w: F.cross_entropy((h @ w.to(h.dtype).t()).float(), t))
def liger(const, accum):
    def f(h, w):
        return L.apply(h, w.to(h.dtype), t, None, None, -100, 0.0, 0.0, "mean", None, False, accum,
                       False, False, False, None, None, const)
    return f
def bench(fn):
    def once():
        out = fn(h, w)
        (out[0] if isinstance(out, tuple) else out).backward()
    for _ in range(3):
        once()
    return triton.testing.do_bench(once, warmup=5, rep=40, grad_to_none=[h, w])
ref = plain(h, w).item()
print(f"plain compiled: {bench(plain):.3f} ms  loss {ref:.5f}", flush=True)
for accum in (torch.float32, None):
    for const in (1, 4, 16, 66):
        fn = liger(const, accum)
        out = fn(h, w); val = (out[0] if isinstance(out, tuple) else out).item()
        print(f"liger const {const:3d} accum {accum}: {bench(fn):.3f} ms  loss {val:.5f}", flush=True)
