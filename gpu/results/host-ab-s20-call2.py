"""s20 call 2: host time per call (50 calls without a sync, min of 7), this repo's launchers."""
import sys, time, torch
sys.path.insert(0, "."); sys.path.insert(0, "gpu")
from ltm.bench.kernels import implementations, make_inputs
from host_overhead import pass_fn, host_ms
dev = torch.device("cuda")
tag = sys.argv[1]
for op in ("delta_rule", "gated_delta_rule", "rwkv7"):
    impl = implementations(op, dev)["triton"]
    x = make_inputs(op, 2, 8192, 8, 128, torch.bfloat16, dev)
    for backward in (False, True):
        step = pass_fn(impl, x, backward)
        for _ in range(3): step()
        torch.cuda.synchronize()
        print(f"{tag} {op} {'fb' if backward else 'fwd'} host {min(host_ms(step) for _ in range(7))*1e3:.1f} us/call", flush=True)
