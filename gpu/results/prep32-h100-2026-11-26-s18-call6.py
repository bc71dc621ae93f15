# the prep by 32-row blocks against the 16-row one: time (CUDA graph, do_bench) and error vs float64
import sys, json, torch, triton
sys.path.insert(0, ".")
from ltm.bench.kernels import make_inputs, implementations
from ltm.kernels import tuning
from ltm.kernels.delta_rule import chunk
from ltm.ops.delta_rule.naive import naive_delta_rule
dev = torch.device("cuda")
out = sys.argv[1]
VARIANTS = [("16", 16, None), ("32w2", 32, {"num_warps": 2, "num_stages": 1}), ("32w4", 32, {"num_warps": 4, "num_stages": 1})]
rows = []
def setv(block, forced):
    chunk.PREP_BLOCK = block
    tuning.FORCED.clear()
    if forced:
        tuning.FORCED["delta_rule.prep"] = dict(forced, num_stages=forced["num_stages"])
# accuracy first: bf16, against the float64 token loop
for shape in [(2, 1000, 4, 128), (1, 2000, 2, 64)]:
    for op in ("delta_rule", "gated_delta_rule"):
        x = make_inputs(op, *shape, torch.bfloat16, dev)
        fn = implementations(op, dev)["triton"]
        names = [n for n, t in x.items() if torch.is_tensor(t) and t.requires_grad]
        ins = [x[n] for n in names]
        xd = {n: (t.detach().double().requires_grad_() if torch.is_tensor(t) and t.requires_grad else t) for n, t in x.items()}
        o_ref = naive_delta_rule(xd["q"], xd["k"], xd["v"], xd["beta"], xd.get("g"))[0]
        do = torch.randn_like(o_ref)
        g_ref = torch.autograd.grad(o_ref, [xd[n] for n in names], do)
        for name, block, forced in VARIANTS:
            setv(block, forced)
            o = fn(x)
            grads = torch.autograd.grad(o, ins, do.to(o.dtype))
            rel = lambda a, b: float((a.double() - b).norm() / b.norm())
            r = {"kind": "error", "shape": shape, "op": op, "variant": name, "o": rel(o, o_ref),
                 **{f"d{n}": rel(gr, gref) for n, gr, gref in zip(names, grads, g_ref)}}
            rows.append(r); print(json.dumps(r), flush=True)
for shape in [(2, 8192, 8, 128), (8, 2048, 8, 128), (32, 2048, 4, 128), (8, 2048, 16, 64), (2, 32768, 8, 128), (1, 32768, 4, 128), (16, 512, 32, 64)]:
    x = make_inputs("delta_rule", *shape, torch.bfloat16, dev)
    fn = implementations("delta_rule", dev)["triton"]
    ins = [t for t in x.values() if torch.is_tensor(t) and t.requires_grad]
    do = torch.randn_like(fn(x))
    for name, block, forced in VARIANTS:
        setv(block, forced)
        def fwd():
            with torch.no_grad():
                return fn(x)
        def fb():
            return torch.autograd.grad(fn(x), ins, do)
        r = {"kind": "time", "shape": shape, "variant": name}
        for pname, step in (("fwd", fwd), ("fb", fb)):
            for _ in range(3):
                step()
            r[pname + "_graph"] = float(triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median"))
            r[pname + "_bench"] = float(triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median"))
        rows.append(r); print(json.dumps(r), flush=True)
    json.dump(rows, open(out, "w"), indent=1)
json.dump(rows, open(out, "w"), indent=1)
