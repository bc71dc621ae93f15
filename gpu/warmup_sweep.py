"""One-off: the gated delta rule's state passes by decay warm-ups against the exact passes and fla
as installed, forward and forward+backward, bf16, one process.

    python3 gpu/warmup_sweep.py OUT.json "B,T,H,D;..." VARIANT,...

A shape ending in "w" has decays 1e-4 of the usual (never below the floor in 32k tokens: the
worst case). Variants: off (both passes exact), def (the defaults: warm-ups where the rules take
them), fla, onF (both by warm-ups at fill F), fwF (the forward's only); "n" after onF/fwF turns
WARMUP_WIDE off (the warm-up launches take the sequential passes' first value block, and their
segments are counted in programs of it: 16-wide at 1,32768,8,128, so on4n there is the narrow
patch's on2); "x" after that turns WARMUP_SPLIT_HEADS off (the heads that never decay go exact
inside the warm-up launch, on its blocks); "a" after that turns WARMUP_WIDE_FORWARD_ALWAYS on (the
forward's warm-ups wide where its narrow programs fill the SMs too, as c0dd6cf's were);
":bBVwWsS" after that forces the warm-up launches' value block, warps and stages (e.g.
on4:b64w4s3). "-wu" at the end of any variant: the forward without a backward makes D from W and
U (chunk.FORWARD_FROM_LINV "never"), e.g. def-wu; "-lx": from L^-1 wherever the pass can
("always"); neither: the module's default ("fused")."""
import json, re, sys, time
import torch, triton
from ltm.bench.kernels import make_inputs, implementations
from ltm.bench.host_overhead import pass_fn
from ltm.bench.timing import gpu_ms, graph_ms
from ltm.kernels import tuning
from ltm.kernels.delta_rule import chunk, segment_choices, triton_chunk_delta_rule

WARMUP_LAUNCHES = ("delta_rule.fwd_warmup", "delta_rule.fwd_warmup_output", "delta_rule.bwd_warmup")


def variant_fn(var: str):
    """The variant's call, with the module switches and forced launches it needs set."""
    for name in WARMUP_LAUNCHES:
        tuning.FORCED.pop(name, None)
    segment_choices.WARMUP_FILL, segment_choices.WARMUP_BACKWARD = 2, True
    segment_choices.WARMUP_WIDE, segment_choices.WARMUP_SPLIT_HEADS = True, True
    segment_choices.WARMUP_WIDE_FORWARD_ALWAYS = False
    chunk.FORWARD_FROM_LINV = ("never" if var.endswith("-wu") else "always" if var.endswith("-lx")
                               else "fused")  # (the module's default)
    var = var.removesuffix("-wu").removesuffix("-lx")
    if var == "off":
        return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], warmup=False)[0]
    if var == "def":  # the module's defaults, warm-ups where its rules take them
        return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"])[0]
    kind, fill, narrow, joined, always, forced = re.fullmatch(
        r"(on|fw)(\d+)(n?)(x?)(a?)(?::(b\d+w\d+s\d+))?", var).groups()
    segment_choices.WARMUP_FILL = int(fill)
    segment_choices.WARMUP_WIDE = not narrow
    segment_choices.WARMUP_SPLIT_HEADS = not joined
    segment_choices.WARMUP_WIDE_FORWARD_ALWAYS = bool(always)
    segment_choices.WARMUP_BACKWARD = kind == "on"
    if forced:
        bv, warps, stages = map(int, re.findall(r"\d+", forced))
        for name in WARMUP_LAUNCHES:
            tuning.FORCED[name] = {"BV": bv, "num_warps": warps, "num_stages": stages}
    on = True if kind == "on" else None  # fw: the forward's by the module default, True
    return lambda x: triton_chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], warmup=on)[0]


def main(out: str, shapes: list[str], variants: list[str]) -> None:
    dev = torch.device("cuda")
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for text in shapes:
        B, T, H, D = map(int, text.rstrip("w").split(","))
        x = make_inputs("gated_delta_rule", B, T, H, D, torch.bfloat16, dev)
        if text.endswith("w"):
            x["g"] = (x["g"].detach() * 1e-4).requires_grad_()
        impls = implementations("gated_delta_rule", dev)
        outs = {}
        for var in variants:
            if var == "fla" and "fla" not in impls:
                continue
            t0 = time.time()
            try:
                fn = impls["fla"] if var == "fla" else variant_fn(var)
                with torch.no_grad():
                    outs[var] = fn(x).float()
                for backward in (False, True):
                    step = pass_fn(fn, x, backward)
                    for _ in range(3):
                        step()
                    ms = gpu_ms(step, warmup_ms=10, rep_ms=60)
                    gms = graph_ms(step, rep_ms=60) if var != "fla" else None
                    ref = outs.get("off", outs[var])
                    err = ((outs[var] - ref).norm() / ref.norm()).item()
                    rows.append({"shape": text, "variant": var, "pass": "fb" if backward else "fwd",
                                 "bench_ms": ms, "graph_ms": gms, "rel_err_vs_off": err,
                                 "setup_s": time.time() - t0})
                    print(f"{text:16s} {var:12s} {rows[-1]['pass']:3s} bench {ms:.3f} graph "
                          f"{gms if gms is None else round(gms, 3)} err {err:.2e}", flush=True)
            except Exception as err:  # a forced launch that does not fit: a row, not a stop
                rows.append({"shape": text, "variant": var, "error": str(err).splitlines()[0][:200]})
                print(f"{text:16s} {var:12s} error {rows[-1]['error']}", flush=True)
            json.dump({**meta, "rows": rows}, open(out, "w"), indent=1)
    variant_fn("off")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(";"), sys.argv[3].split(","))
