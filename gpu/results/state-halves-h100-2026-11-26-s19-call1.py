# the forward's state pass with the state as two 64-row halves (launch_choices.STATE_HALVES) against one (K, BV) tile
import sys, json, torch, triton
sys.path.insert(0, ".")
from ltm.bench.kernels import make_inputs, implementations, floor_ms, measure_ceilings
from ltm.kernels import tuning
from ltm.kernels.delta_rule import launch_choices as lc
dev = torch.device("cuda")
out = sys.argv[1]
shapes = [tuple(int(n) for n in s.split(",")) for s in sys.argv[2:]]
ceil = measure_ceilings(dev, 10, 60)
rows = []
for op in ("delta_rule", "gated_delta_rule"):
  for shape in shapes:
    if op == "gated_delta_rule" and shape not in [(2, 8192, 8, 128), (1, 32768, 4, 128)]:
        continue
    x = make_inputs(op, *shape, torch.bfloat16, dev)
    fn = implementations(op, dev)["triton"]
    ins = [t for t in x.values() if torch.is_tensor(t) and t.requires_grad]
    do = torch.randn_like(fn(x))
    ref = None
    for halves in (False, True, False, True):
        lc.STATE_HALVES = halves
        def fwd():
            with torch.no_grad():
                return fn(x)
        def fb():
            return torch.autograd.grad(fn(x), ins, do)
        o = fwd(); gr = fb()
        if ref is None:
            ref = (o, gr)
        err_o = float((o.float() - ref[0].float()).abs().max() / ref[0].float().abs().max())
        err_g = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(gr, ref[1]))
        r = {"op": op, "shape": shape, "halves": halves, "err_o": err_o, "err_grad": err_g}
        for pname, step in (("fwd", fwd), ("fb", fb)):
            for _ in range(3):
                step()
            r[pname + "_graph"] = float(triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median"))
            r[pname + "_bench"] = float(triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median"))
        r["fwd_floor"] = floor_ms(op, *shape, 2, False, ceil)
        rows.append(r); print(json.dumps(r), flush=True)
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, open(out, "w"), indent=1)
