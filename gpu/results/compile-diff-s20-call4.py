"""s20 call 4: why test_under_torch_compile[inference] differs (compiled vs eager overlapped forward)."""
import sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "tests"); sys.path.insert(0, "tests/kernels")
from ltm.kernels.delta_rule import launch_choices, triton_chunk_delta_rule
from test_kernels_delta_rule import make_inputs
tag = sys.argv[1]
xs = [None if x is None else x.detach() for x in make_inputs(2, 1000, 8, 128, 128, "weak", True, torch.bfloat16, 1234)]
do = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
def op(q, k, v, beta, g, h0):
    return triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)
def value(q, k, v, beta, g, h0):
    o, ht = op(q, k, v, beta, g, h0)
    return (o.float() * do).sum() + ht.sum()
def cmp(name, a, b):
    oa, ha = a; ob, hb = b
    d = (oa.float() - ob.float()).abs()
    bad = (d > 0).nonzero()
    first = bad[:, 1].min().item() if len(bad) else None
    print(f"{tag} {name}: o equal {torch.equal(oa, ob)} maxdiff {d.max().item():.3e} ndiff {len(bad)} first token {first}; ht equal {torch.equal(ha, hb)} maxdiff {(ha-hb).abs().max().item():.3e}", flush=True)
with torch.no_grad():
    eager = op(*xs); eager2 = op(*xs)
    cmp("eager vs eager", eager, eager2)
    saved = launch_choices._overlaps_output
    launch_choices._overlaps_output = lambda cls, NT, backward=True: False
    two = op(*xs)
    launch_choices._overlaps_output = saved
    cmp("eager overlapped vs two-launch", eager, two)
    compiled = torch.compile(op, fullgraph=True)
    c1 = compiled(*xs); c2 = compiled(*xs)
    cmp("compiled vs eager", c1, eager); cmp("compiled 2 vs eager", c2, eager); cmp("compiled vs two-launch", c1, two)
    ve = value(*xs); vc = torch.compile(value, fullgraph=True)(*xs)
    vfe = (eager[0].float() * do).sum() + eager[1].sum()
    print(f"{tag} value eager {ve.item():.6f} compiled {vc.item():.6f} recomputed-from-eager-o {vfe.item():.6f}; "
          f"|o*do| sum {(eager[0].float()*do).abs().sum().item():.1f} |ht| sum {eager[1].abs().sum().item():.1f}", flush=True)
