# one prep variant (whichever repo this runs from): forward and forward+backward times, the prep kernel's own time
import sys, json, torch, triton
sys.path.insert(0, ".")
from torch.profiler import ProfilerActivity, profile
from ltm.bench.kernels import make_inputs, implementations, floor_ms, measure_ceilings
dev = torch.device("cuda")
out, label = sys.argv[1], sys.argv[2]
shapes = [tuple(int(n) for n in s.split(",")) for s in sys.argv[3:]]
ceil = measure_ceilings(dev, 10, 60)
rows = []
for op in ("delta_rule", "gated_delta_rule"):
  for shape in shapes:
    torch.manual_seed(0)
    x = make_inputs(op, *shape, torch.bfloat16, dev)
    fn = implementations(op, dev)["triton"]
    ins = [t for t in x.values() if torch.is_tensor(t) and t.requires_grad]
    do = torch.randn_like(fn(x))
    def fwd():
        with torch.no_grad():
            return fn(x)
    def fb():
        return torch.autograd.grad(fn(x), ins, do)
    o = fwd(); gr = fb()
    torch.save({"o": o.cpu(), "g": [g.cpu() for g in gr]}, f"/tmp/{label}_{op}_{'_'.join(map(str, shape))}.pt")
    r = {"label": label, "op": op, "shape": shape}
    for pname, step in (("fwd", fwd), ("fb", fb)):
        for _ in range(3):
            step()
        r[pname + "_graph"] = float(triton.testing.do_bench_cudagraph(step, rep=80, return_mode="median"))
        r[pname + "_bench"] = float(triton.testing.do_bench(step, warmup=10, rep=80, return_mode="median"))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        r[pname + "_kernels_us"] = {e.key[:40]: round(e.device_time_total / 10, 1) for e in prof.key_averages() if e.device_time_total > 0}
    r["fwd_floor"] = floor_ms(op, *shape, 2, False, ceil)
    rows.append(r)
    print(f"{label:5s} {op:17s} {str(shape):20s} fwd graph {r['fwd_graph']:.4f} bench {r['fwd_bench']:.4f} (x{r['fwd_bench']/r['fwd_floor']:.2f}) fb graph {r['fb_graph']:.4f} bench {r['fb_bench']:.4f} | fwd kernels {r['fwd_kernels_us']}", flush=True)
    json.dump(rows, open(out, "w"), indent=1)
