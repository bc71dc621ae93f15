# the overlapped kernel's output value block (BVO) and the looping prep's stages, forward without a backward
import sys, json, torch, triton
sys.path.insert(0, ".")
from ltm.bench.kernels import make_inputs, implementations
from ltm.kernels import tuning
dev = torch.device("cuda")
rows = []
OVL = [dict(BV=32, BVO=128, EVERY=4, num_stages=3), dict(BV=32, BVO=64, EVERY=4, num_stages=3),
       dict(BV=32, BVO=32, EVERY=4, num_stages=3), dict(BV=16, BVO=128, EVERY=4, num_stages=4),
       dict(BV=16, BVO=64, EVERY=4, num_stages=4)]
PREP = [dict(num_warps=2, num_stages=2), dict(num_warps=2, num_stages=3)]
for shape in [(2, 8192, 8, 128), (2, 32768, 8, 128), (4, 4096, 4, 128)]:
    x = make_inputs("delta_rule", *shape, torch.bfloat16, dev)
    fn = implementations("delta_rule", dev)["triton"]
    ref = None
    for prep in PREP:
        for ovl in OVL:
            tuning.FORCED.clear()
            tuning.FORCED["delta_rule.prep"] = prep
            tuning.FORCED["delta_rule.fwd_overlapped"] = dict(ovl, num_warps=4, LANES=128)
            def fwd():
                with torch.no_grad():
                    return fn(x)
            try:
                o = fwd()
            except Exception as err:
                print(shape, prep, ovl, "FAILED", str(err)[:100], flush=True); continue
            same = None if ref is None else bool(torch.equal(o, ref))
            ref = o if ref is None else ref
            for _ in range(3):
                fwd()
            r = {"shape": shape, "prep": prep, "ovl": ovl, "equal": same,
                 "bench": float(triton.testing.do_bench(fwd, warmup=25, rep=100, return_mode="median")),
                 "graph": float(triton.testing.do_bench_cudagraph(fwd, rep=60, return_mode="median"))}
            rows.append(r); print(json.dumps(r), flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
