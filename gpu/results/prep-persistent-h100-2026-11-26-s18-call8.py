# the prep on programs that loop over the chunks (PREP_PROGRAMS_PER_SM) against one program per chunk
import sys, json, torch, triton
sys.path.insert(0, ".")
from ltm.bench.kernels import make_inputs, implementations
from ltm.kernels import tuning
from ltm.kernels.delta_rule import chunk
dev = torch.device("cuda")
out = sys.argv[1]
VARIANTS = [("default", 0, None), ("p4w2s1", 4, (2, 1)), ("p4w2s2", 4, (2, 2)), ("p4w4s2", 4, (4, 2)), ("p2w4s2", 2, (4, 2)), ("p8w2s2", 8, (2, 2))]
rows = []
for shape in [(2, 8192, 8, 128), (8, 2048, 8, 128), (32, 2048, 4, 128), (2, 32768, 8, 128), (8, 2048, 16, 64)]:
    x = make_inputs("delta_rule", *shape, torch.bfloat16, dev)
    fn = implementations("delta_rule", dev)["triton"]
    ins = [t for t in x.values() if torch.is_tensor(t) and t.requires_grad]
    do = torch.randn_like(fn(x))
    ref = None
    for name, per_sm, ws in VARIANTS:
        chunk.PREP_PROGRAMS_PER_SM = per_sm
        tuning.FORCED.clear()
        if ws:
            tuning.FORCED["delta_rule.prep"] = {"num_warps": ws[0], "num_stages": ws[1]}
        def fwd():
            with torch.no_grad():
                return fn(x)
        def fb():
            return torch.autograd.grad(fn(x), ins, do)
        o = fwd()
        same = None if ref is None else bool(torch.equal(o, ref))
        ref = o if ref is None else ref
        r = {"shape": shape, "variant": name, "equal_to_default": same}
        for pname, step in (("fwd", fwd), ("fb", fb)):
            for _ in range(3):
                step()
            r[pname + "_graph"] = float(triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median"))
        rows.append(r); print(json.dumps(r), flush=True)
    json.dump(rows, open(out, "w"), indent=1)
