"""Temporary: device time (sum of kernel times, profiler) and do_bench time of the linear and deep
Titans memory's forward+backward against our delta rule, same inputs."""
import json, sys
import torch
sys.path.insert(0, "gpu")
from titans_profile import delta_rule_call, kernel_times, memory_call
from ltm.bench.timing import gpu_ms
from ltm.bench.titans_depths import make_inputs, memory_weights

out = {}
for shape in ("8,2048,12,64", "2,8192,12,64"):
    B, T, H, D = (int(n) for n in shape.split(","))
    x = make_inputs(B, T, H, D, torch.bfloat16, "cuda")
    leaves = list(x.values())
    calls = {"delta_rule": delta_rule_call(x)}
    lin, deep = memory_weights(1, H, D, "cuda"), memory_weights(2, H, D, "cuda")
    for c in (16, 32, 64):
        calls[f"linear c{c}"] = memory_call(x, lin, c)
    calls["deep c16"] = memory_call(x, deep, 16)
    for name, run in calls.items():
        rows = kernel_times(run)
        device = sum(r["ms"] for r in rows)
        bench = gpu_ms(run, warmup_ms=10, rep_ms=100, grad_to_none=leaves)
        out[f"{shape} {name}"] = {"device_ms": round(device, 4), "do_bench_ms": round(bench, 4),
                                  "kernels": rows[:10]}
        print(f"{shape} {name:10s} device {device:.3f} ms  do_bench {bench:.3f} ms", flush=True)
    base = out[f"{shape} delta_rule"]["device_ms"]
    for name in calls:
        print(f"   {name}: {out[f'{shape} {name}']['device_ms'] / base:.2f}x the delta rule's device time", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
