"""Trains a Titans model (any `python -m ltm.stages.train` arguments) with its memory op wrapped,
and captures the first memory call whose backward goes wrong: a non-finite gradient from a finite
incoming one, or (--ratio R) a key gradient more than R times the incoming gradient. For that
call's worst (batch, head) it saves the inputs, the incoming gradient and the model's gradient to
$OUT/titans-capture.pt (a few MB) and, right away, runs the same slice through the Triton kernels
(bf16 and float32), the chunked PyTorch form (float32 and float64) and the gate products' vjp
alone, printing which gradients are non-finite or large and where along the sequence.

    OUT=DIR python3 gpu/titans_capture.py [--ratio R] --params configs/gpu.yaml --set ... --out RUN

A diagnosis tool for issue 56 (the deep memory's nan at T 8192; LOG.md, 2026-11-28, sixth
session). Eager training only: a compiled model calls the op inside a graph."""
from __future__ import annotations

import os
import runpy
import sys

import torch

import ltm.model.titans as titans_mixer
from ltm.kernels.titans.gates import chunk_gates
from ltm.ops.titans import chunk_titans_memory

ORIGINAL = titans_mixer.titans_memory
NAMES = ("q", "k", "v", "theta", "alpha", "eta")
found: dict = {}


def largest(t: torch.Tensor) -> float:
    return t.detach().float().abs().nan_to_num(nan=float("inf")).max().item()


def describe(name: str, grads: list[torch.Tensor]) -> None:
    parts = []
    for label, g in zip(NAMES + ("W1", "W2"), grads):
        bad = (~torch.isfinite(g)).sum().item()
        parts.append(f"d{label} {largest(g):.3g}" + (f" ({bad} non-finite)" if bad else ""))
    print(f"  {name}: " + ", ".join(parts), flush=True)
    dk = grads[1].detach().float().abs().nan_to_num(nan=float("inf"))[0, :, 0].amax(-1)
    blocks = dk[: dk.shape[0] // 512 * 512].view(-1, 512).amax(1)
    print("    |dk| per 512 tokens: " + " ".join(f"{x:.1e}" for x in blocks.tolist()), flush=True)


def replay(capture: dict) -> None:
    """The captured slice through every implementation, and the gate products' vjp alone."""
    inputs, weights, do, options = (capture[key] for key in ("inputs", "weights", "do", "options"))
    runs = (("triton bf16", torch.bfloat16, True), ("triton float32", torch.float32, True),
            ("torch float32", torch.float32, False), ("torch float64", torch.float64, False))
    for name, dtype, triton in runs:
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        xs = [x.detach().to(dtype if i < 3 else state_dtype).clone().requires_grad_()
              for i, x in enumerate(inputs)]
        ws = [w.detach().to(state_dtype).clone().requires_grad_() for w in weights]
        if triton:
            o, _ = ORIGINAL(*xs, ws, **options)
        else:
            o, _ = chunk_titans_memory(*xs, ws, chunk_size=options["chunk_size"],
                                       grad_clip=options["grad_clip"])
        o.backward(do.to(o.dtype))
        describe(f"{name} (|o| {largest(o):.3g})", [x.grad for x in xs] + [w.grad for w in ws])
    alpha, eta = (x.detach().float().clone().requires_grad_() for x in inputs[4:6])
    gates, vjp = torch.func.vjp(lambda a, e: chunk_gates(a, e, options["chunk_size"]), alpha, eta)
    print(f"  gate products: eta min {eta.min().item():.3g}, alpha max {alpha.max().item():.3g}, "
          f"non-finite outputs {sum((~torch.isfinite(g)).sum().item() for g in gates)}", flush=True)
    dalpha, deta = vjp(tuple(torch.ones_like(g) for g in gates))
    print(f"  gate vjp (ones): |dalpha| {largest(dalpha):.3g}, |deta| {largest(deta):.3g}",
          flush=True)


def watch(call: int, inputs: tuple, weights: list, options: dict, o: torch.Tensor,
          ratio: float) -> None:
    """Hooks on o and k that keep the first bad call's slice in `found`."""
    incoming = {}
    o.register_hook(lambda g: incoming.__setitem__("do", g.detach()))

    def on_key_grad(g: torch.Tensor) -> None:
        do = incoming.get("do")
        if found or do is None or not torch.isfinite(do).all():
            return
        bad = ~torch.isfinite(g).all() or largest(g) > ratio * max(largest(do), 1e-3)
        if not bad:
            return
        per_head = g.float().abs().nan_to_num(nan=float("inf")).amax(dim=(1, 3))  # (B, H)
        b, h = divmod(int(per_head.argmax()), per_head.shape[1])
        cut = lambda x: x[b:b + 1, :, h:h + 1].detach().clone()
        found.update(call=call, batch=b, head=h, inputs=[cut(x) for x in inputs],
                     weights=[w[h:h + 1].detach().float().clone() for w in weights],
                     do=cut(do), dk_model=cut(g), options=options)
        print(f"captured call {call}: batch {b} head {h}, |do| {largest(do):.3g}, "
              f"|dk| {largest(g):.3g}, non-finite {(~torch.isfinite(g)).sum().item()}", flush=True)

    inputs[1].register_hook(on_key_grad)


def main() -> None:
    ratio = float("inf")
    if sys.argv[1:2] == ["--ratio"]:
        ratio = float(sys.argv[2])
        del sys.argv[1:3]
    calls = {"n": 0, "replayed": False}

    def wrapped(q, k, v, theta, alpha, eta, weights, **options):
        if found and not calls["replayed"]:
            calls["replayed"] = True
            torch.save(found, os.path.join(os.environ.get("OUT", "."), "titans-capture.pt"))
            with torch.enable_grad():
                replay(found)
        o, state = ORIGINAL(q, k, v, theta, alpha, eta, weights, **options)
        if not found and torch.is_grad_enabled() and k.requires_grad:
            watch(calls["n"], (q, k, v, theta, alpha, eta), list(weights), options, o, ratio)
            calls["n"] += 1
        return o, state

    titans_mixer.titans_memory = wrapped
    sys.argv = ["ltm.stages.train"] + sys.argv[1:]
    runpy.run_module("ltm.stages.train", run_name="__main__")


if __name__ == "__main__":
    main()
