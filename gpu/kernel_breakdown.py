"""One-off: the gated delta rule's GPU time kernel by kernel, ours beside fla as installed
(issue 55: FlashQLA's forward+backward took 1.10 ms at 4,4096,16,128 on an H100 where ours took
1.60 of GPU time, and its forward 0.60-0.95x ours at every grid shape). torch.profiler over REPEATS
calls after three untimed ones (compiles, fla's autotuning, TileLang's compiles), the device time
of each kernel per call, largest first; a JSON row per (shape, implementation, pass) into OUT.json,
kept after each row.

    python3 gpu/kernel_breakdown.py OUT.json ["B,T,H,D;..."] [REPEATS]
"""
import json, sys
import torch
from ltm.bench.host_overhead import kernel_times, pass_fn
from ltm.bench.kernels import implementations, make_inputs

SHAPES = "4,4096,16,128;8,2048,8,128;1,32768,8,128"


def per_kernel_ms(step, repeats: int) -> dict[str, float]:
    """Each kernel's device time per call (ms), largest first, after three untimed calls."""
    for _ in range(3):
        step()
    return kernel_times(step, repeats)


def main(out: str, shapes: str = SHAPES, repeats: int = 10) -> None:
    dev = torch.device("cuda")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for text in shapes.split(";"):
        B, T, H, D = map(int, text.split(","))
        x = make_inputs("gated_delta_rule", B, T, H, D, torch.bfloat16, dev)
        impls = implementations("gated_delta_rule", dev)
        for name in [n for n in ("triton", "fla") if n in impls]:  # fla: as installed
            for backward in (False, True):
                kernels = per_kernel_ms(pass_fn(impls[name], x, backward), repeats)
                row = {"shape": text, "impl": name, "pass": "fb" if backward else "fwd",
                       "total_ms": round(sum(kernels.values()), 4),
                       "kernels_ms": {k: round(v, 4) for k, v in kernels.items()}}
                meta["rows"].append(row)
                print(f"== {text} {name} {row['pass']}: {row['total_ms']:.3f} ms of kernels")
                for kernel, ms in list(kernels.items())[:12]:
                    print(f"   {ms:8.4f}  {kernel[:90]}")
                with open(out, "w") as f:
                    json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *(int(a) for a in sys.argv[3:4]))
