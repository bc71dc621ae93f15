# the overlapped launch's counters zeroed by the prep, and the overlapped launch as the prep's programmatic dependent
import sys, json, time, torch, triton
sys.path.insert(0, ".")
from ltm.bench.kernels import make_inputs, implementations, floor_ms, measure_ceilings
from ltm.kernels.delta_rule import launch_choices as lc
dev = torch.device("cuda")
out = sys.argv[1]
shapes = [tuple(int(n) for n in s.split(",")) for s in sys.argv[2:]]
ceil = measure_ceilings(dev, 10, 60)
VARIANTS = [("memset", False, False), ("zero_in_prep", True, False), ("zero+pdl", True, True), ("memset+pdl", False, True)]
rows = []
def host_ms(step, n=50):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): step()
    e = time.perf_counter() - t0; torch.cuda.synchronize(); return 1e3 * e / n
for op in ("delta_rule", "gated_delta_rule"):
  for shape in shapes:
    x = make_inputs(op, *shape, torch.bfloat16, dev)
    fn = implementations(op, dev)["triton"]
    ins = [t for t in x.values() if torch.is_tensor(t) and t.requires_grad]
    do = torch.randn_like(fn(x))
    ref = None
    for rep in range(2):
      for name, zero, pdl in VARIANTS:
        lc.ZERO_COUNTS_IN_PREP, lc.PREP_DEPENDENT_LAUNCH = zero, pdl
        def fwd():
            with torch.no_grad():
                return fn(x)
        def fb():
            return torch.autograd.grad(fn(x), ins, do)
        o = fwd(); gr = fb()
        if ref is None:
            ref = (o, gr)
        same = bool(torch.equal(o, ref[0]) and all(torch.equal(a, b) for a, b in zip(gr, ref[1])))
        r = {"op": op, "shape": shape, "variant": name, "rep": rep, "equal": same}
        for pname, step in (("fwd", fwd), ("fb", fb)):
            for _ in range(3):
                step()
            r[pname + "_graph"] = float(triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median"))
            r[pname + "_bench"] = float(triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median"))
            r[pname + "_host"] = host_ms(step)
        r["fwd_floor"] = floor_ms(op, *shape, 2, False, ceil)
        rows.append(r)
        print(f"{op:17s} {str(shape):22s} {name:13s} eq {same} fwd graph {r['fwd_graph']:.4f} bench {r['fwd_bench']:.4f} host {r['fwd_host']:.4f} (x{r['fwd_bench']/r['fwd_floor']:.2f} / x{r['fwd_graph']/r['fwd_floor']:.2f}) | fb graph {r['fb_graph']:.4f} bench {r['fb_bench']:.4f} host {r['fb_host']:.4f}", flush=True)
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, open(out, "w"), indent=1)
