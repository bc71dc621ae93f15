"""Latent thoughts' training cost on one GPU (issue 15): the inner loop eager against a compiled
inner step, against a compiled plain training step.

    python gpu/latent_bench.py OUT.json [--budget SECONDS] [--repeats N]
    python gpu/latent_bench.py OUT.json --tiny     # the same sections, tiny, on the CPU
    python gpu/latent_bench.py OUT.json --init encoder --inner-steps 2   # semi-amortised

The GPU profile's model (configs/gpu.yaml: attention, 12 layers, d_model 768, 12 heads, vocab
50304) at T=1024, batch 16, bf16 autocast, TF32, fused AdamW, random tokens and weights; the
latent model adds n_latent 8 thoughts per layer and fits them with 16 inner steps (the authors'
recipe, train.latent's defaults). Every timed step runs first untimed (compilation); the time is
the median of --repeats. Sections, cheapest first; OUT.json is rewritten after each, so a run cut
short keeps what it measured, and a section whose turn comes after --budget seconds (default
330; compiling the three graphs takes most of it) is listed as skipped:

1. plain training step (forward, backward, AdamW), eager and compiled: ms, tokens/s
2. one inner step (forward, backward to mu and log sigma^2, the update of q), eager
3. the whole latent training step, decoder compiled, inner loop eager: ms, tokens/s
4. one inner step compiled (ltm.latent.posterior.PosteriorFitter compile=True: the NLL's forward and
   backward to z compiled, the decoder frozen, the head's loss through ltm.model.cross_entropy)
5. the whole latent step with the compiled inner step: ms, tokens/s
6. the top operations of one compiled inner step by GPU time (torch.profiler)
7. one inner step compiled with CUDA graphs (mode="reduce-overhead"; CUDA only)
8. the whole latent step with that inner step

x_plain: ms / the compiled plain step's ms (the eager plain step's in --tiny runs without
compile). Needs torch with CUDA; --tiny runs on the CPU in a minute or two (compile included;
--no-compile for seconds).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from source_checkout import ROOT  # noqa: E402  (the checkout's ltm, installed or not)

from ltm.bench import latent_run  # noqa: E402


def parse() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no further section starts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU: a check")
    parser.add_argument("--no-compile", action="store_true", help="eager rows only")
    parser.add_argument("--skip", default="", help="section numbers to leave out, e.g. 2,3,6")
    parser.add_argument("--inner-steps", type=int, default=None,
                        help="inner steps of the latent step (default: the authors' 16)")
    parser.add_argument("--init", choices=("authors", "prior", "encoder"), default="authors",
                        help="q's start (train.latent.init); encoder: semi-amortised, its own "
                             "NELBO in the step")
    parser.add_argument("--fused-ops", default="",
                        help="ltm.train.fused_ops kernels swapped into both models (train.opt.fused_ops), "
                             "e.g. rms_norm,swiglu,rope")
    return parser.parse_args()


def main() -> None:
    args = parse()
    began = time.perf_counter()
    run = latent_run.setup(args.out, args.budget, args.repeats, args.tiny, not args.no_compile,
                           args.skip, [op for op in args.fused_ops.split(",") if op],
                           ROOT / "configs" / "gpu.yaml", began, args.inner_steps, args.init)
    latent_run.plain_sections(run)
    latent_run.latent_sections(run)
    latent_run.finish(run)


if __name__ == "__main__":
    main()
