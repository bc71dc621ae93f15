"""Text generation: checkpoints and tokenizers loaded, prompts (and a latent model's z) prepared,
weights optionally quantised, and the command; the tokens come from `ltm.model.decoding` (gpt-fast
style: static buffers, the one-token step captured in a CUDA graph, sampling on the device).

    python -m ltm.generate --checkpoint data/checkpoints --prompt "ROMEO:" --max-new-tokens 200
    python -m ltm.generate --checkpoint data/checkpoints/counterpart-latent --prior data/checkpoints/prior
    texts = sample_text("data/checkpoints", "data/cache", ["ROMEO:", "JULIET:"], seed=0)

"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch
from tokenizers import Tokenizer
from torch import nn

from ltm.data.cache import TOKENIZER_FILE, TokenCache, cache_dir_of
from ltm.data.corpus import DataError
from ltm.data.tokenizer import end_of_text_id, load_tokenizer
from ltm.latent.posterior import LatentConfig
from ltm.latent.prior import describe_latents, latents, load_prior, prompt_latents
from ltm.model.decoding import Decoder, GenerationError, Sampling, check_fits, generate_tokens
from ltm.model.lm import LTM
from ltm.params import ParamsError, check, read_params
from ltm.train.checkpoint import load_latent_config, load_model

QUANTIZE = ("none", "int8", "int4")
# --fit-latents without a count: the checkpoint's train.latent.steps
FIT_AS_TRAINED = -1
# int4 weights are quantised in groups of this many input features (torchao's default)
INT4_GROUP = 128



@dataclass
class SamplesConfig:
    prompts: list[str] = field(default_factory=lambda: ["ROMEO:", "First Citizen:", "The king"])
    max_new_tokens: int = 60
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 50
    seed: int = 0  # the same text for the same checkpoint
    # latent models: z = latent_scale * N(0, I) (the authors sweep 0.5-1.0; with model.latent_norm
    # the decoder RMS-normalises each latent, so a global scale acts only through the norm's eps)
    latent_scale: float = 1.0

    def __post_init__(self) -> None:
        check(len(self.prompts) >= 1, "prompts", "must hold at least one prompt")
        check(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        check(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")


def quantize_model(model: LTM, mode: str) -> LTM:
    """Weight-only quantisation of every nn.Linear through torchao, in place: int8 per output
    channel, or int4 in groups of INT4_GROUP (CUDA only: torchao's tinygemm kernel, bf16). The
    tied head gets a quantised copy; the embedding lookup keeps the float table."""
    if mode not in QUANTIZE:
        raise GenerationError(f"quantize: expected one of {', '.join(QUANTIZE)}, got {mode!r}")
    if mode == "none":
        return model
    if mode == "int4" and model.embed.weight.device.type != "cuda":
        raise GenerationError("quantize int4: torchao's int4 weight-only kernel runs on CUDA "
                              "GPUs only; use int8 on the CPU")
    # torchao warns at import about its CUDA extensions on a CPU-only torch
    logging.getLogger("torchao").setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        raise GenerationError("quantize: needs torchao (pip install torchao==0.18.0), which is "
                              "not installed") from None
    if mode == "int8":
        quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False))
        return model
    model = model.to(torch.bfloat16)
    config = Int4WeightOnlyConfig(group_size=INT4_GROUP, int4_packing_format="tile_packed_to_4d",
                                  set_inductor_config=False)
    # tinygemm tiles: whole groups along the input, multiples of 8 along the output
    quantize_(model, config, filter_fn=lambda m, _: isinstance(m, nn.Linear)
              and m.in_features % INT4_GROUP == 0 and m.out_features % 8 == 0)
    return model


@torch.no_grad()
def mean_loss(model: LTM, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    device, losses = model.embed.weight.device, []
    for x, y in batches:
        losses.append(float(model(x.to(device), y.to(device))[1]))
    return sum(losses) / len(losses)


def quantization_loss_delta(model: LTM, mode: str, batches: Iterable) -> dict:
    """Mean loss of `model` and of a quantised copy on the same (x, y) batches (the token cache's
    validation split: `val_batches`), and the difference: what the quantisation costs."""
    batches = list(batches)
    quantized = quantize_model(copy.deepcopy(model), mode)
    base, quant = mean_loss(model.eval(), batches), mean_loss(quantized.eval(), batches)
    return {"quantize": mode, "loss": base, "quantized_loss": quant, "loss_delta": quant - base}


def val_batches(cache_dir: str | Path, seq_len: int, batch_size: int = 8,
                n_batches: int = 4) -> list:
    return list(TokenCache(cache_dir, "val", verify=False).eval_batches(batch_size, seq_len,
                                                                      n_batches))


def load_matching_tokenizer(where: str | Path, vocab_size: int) -> Tokenizer:
    """The tokenizer at `where` (its file, or the token cache's folder), checked against the
    model's vocabulary (a model may have more rows than the tokenizer has tokens, never fewer)."""
    path = Path(where)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    tokenizer = load_tokenizer(path)
    if tokenizer.get_vocab_size() > vocab_size:
        raise GenerationError(f"{path}: the tokenizer has {tokenizer.get_vocab_size()} tokens, the "
                              f"checkpoint's model only {vocab_size}: it was trained on another "
                              f"token cache (pass its --cache-dir)")
    return tokenizer


def _decode(tokenizer: Tokenizer, ids: list[int], stop: int) -> str:
    return tokenizer.decode(ids[:ids.index(stop)] if stop in ids else ids)


def sample_text(model: LTM | str | Path, tokenizer: Tokenizer | str | Path, prompts: Sequence[str],
                max_new_tokens: int = 100, temperature: float = 0.8, top_k: int | None = 200,
                top_p: float | None = None, seed: int | None = None, quantize: str = "none",
                device: str | None = None, compile: bool = False, latent_scale: float = 1.0,
                latent_fit_steps: int = 0, latent: LatentConfig | None = None) -> list[str]:
    """Each prompt followed by its sampled continuation, cut at the first end-of-text. model: an
    LTM or a checkpoint (folder or file); tokenizer: one, or its file, or the token cache folder.
    A given model is put in eval mode, and copied before quantisation. A latent model's z is
    drawn from its prior N(0, I) scaled by latent_scale (the authors sweep 0.5-1.0) or, with
    latent_fit_steps > 0, is a sample of the posterior fitted to each prompt by that many inner
    steps of `latent` (the checkpoint's train.latent when model is a checkpoint; else None, the
    defaults)."""
    if isinstance(model, LTM):
        model = copy.deepcopy(model) if quantize != "none" else model
    else:
        latent = latent or load_latent_config(model)
        model = load_model(model, _device(device or "auto"))
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_matching_tokenizer(tokenizer, model.cfg.vocab_size)
    model = quantize_model(model, quantize)
    if seed is not None:
        torch.manual_seed(seed)
    eot = end_of_text_id(tokenizer)
    # a document starts after an end-of-text in the token cache
    ids = [[eot] + tokenizer.encode(p).ids for p in prompts]
    z = prompt_latents(model, ids, latent_scale, latent_fit_steps, latent)
    tokens = generate_tokens(model, ids, max_new_tokens, Sampling(temperature, top_k, top_p),
                             z=z, compile=compile)
    return [p + _decode(tokenizer, row, eot) for p, row in zip(prompts, tokens.tolist())]


def write_samples(cfg: SamplesConfig, checkpoint_dir: str | Path, cache_dir: str | Path,
                  samples_path: str | Path) -> list[dict]:
    """Sample each prompt of `cfg` from the checkpoint in `checkpoint_dir` on the CPU (a few seconds
    for the default model), write {"settings", "samples"} to samples_path and return the rows
    (prompt, text)."""
    model = load_model(checkpoint_dir, "cpu")
    tokenizer = load_matching_tokenizer(cache_dir, model.cfg.vocab_size)
    # a small model's context may not hold the prompt and max_new_tokens: sample what fits (the
    # prompt is preceded by an end-of-text token) rather than fail the train stage
    longest = max(len(tokenizer.encode(p).ids) + 1 for p in cfg.prompts)
    new_tokens = max(1, min(cfg.max_new_tokens, model.cfg.max_seq_len - longest + 1))
    texts = sample_text(model, tokenizer, cfg.prompts, new_tokens, cfg.temperature, cfg.top_k,
                        seed=cfg.seed, latent_scale=cfg.latent_scale)
    rows = [{"prompt": prompt, "text": text} for prompt, text in zip(cfg.prompts, texts)]
    settings = {k: v for k, v in asdict(cfg).items() if k != "prompts"}
    settings["new_tokens_sampled"] = new_tokens
    settings["z"] = describe_latents(model, 0, None, cfg.latent_scale)
    Path(samples_path).parent.mkdir(parents=True, exist_ok=True)
    Path(samples_path).write_text(json.dumps({"settings": settings, "samples": rows}, indent=1) + "\n")
    return rows


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GenerationError(f"device: {name} asked for, but torch sees no CUDA device")
    return torch.device(name)


class _Printer:
    """Streams row 0's text: decodes everything so far and prints what is new (a byte-level
    token may end inside a character); stops at end-of-text."""

    def __init__(self, tokenizer: Tokenizer, stop: int) -> None:
        self.tokenizer, self.stop, self.ids, self.shown = tokenizer, stop, [], ""

    def __call__(self, chunk: torch.Tensor) -> bool:
        self.ids += chunk[0].tolist()
        text = _decode(self.tokenizer, self.ids, self.stop)
        print(text[len(self.shown):], end="", flush=True)
        self.shown = text
        return self.stop in self.ids


def run(args: argparse.Namespace) -> None:
    device = _device(args.device)
    model = load_model(args.checkpoint, device, torch.bfloat16 if device.type == "cuda" else None)
    cache_dir = args.cache_dir or cache_dir_of(read_params(args.params))
    tokenizer = load_matching_tokenizer(cache_dir, model.cfg.vocab_size)
    eot = end_of_text_id(tokenizer)
    prompt = torch.tensor([eot] + tokenizer.encode(args.prompt).ids)
    check_fits(len(prompt), args.max_new_tokens, model.cfg.max_seq_len)
    model = quantize_model(model, args.quantize)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    if args.batch < 1:
        raise GenerationError(f"--batch: must be >= 1, got {args.batch}")
    latent = load_latent_config(args.checkpoint)
    # --fit-latents without a count: as many inner steps as the checkpoint was trained with
    fit_steps = latent.steps if args.fit_latents == FIT_AS_TRAINED else args.fit_latents
    z = prompt_latents(model, [prompt.tolist()] * args.batch, args.latent_scale, fit_steps, latent)
    print(f"[{describe_latents(model, fit_steps, latent, args.latent_scale, args.prior_steps, bool(args.prior))}]",
          file=sys.stderr)
    if args.prior:  # the third way: z from the learned prior (ltm.latent.prior, DPM-Solver++)
        z = latents(model, "prior", args.batch, prior=load_prior(args.prior, device),
                    steps=args.prior_steps)
    decoder = Decoder(model, args.batch, len(prompt) + max(args.max_new_tokens - 1, 0), sampling,
                      z=z, compile=args.compile)
    printer = _Printer(tokenizer, eot) if args.batch == 1 else None
    print(args.prompt, end="", flush=True)
    start = time.perf_counter()
    tokens = decoder.generate([prompt] * args.batch, args.max_new_tokens, printer)
    seconds = max(time.perf_counter() - start, 1e-9)
    if printer is None:
        for row, ids in enumerate(tokens.tolist()):
            print(f"\n--- sample {row} ---\n{args.prompt}{_decode(tokenizer, ids, eot)}")
    print(f"\n[{tokens.numel()} tokens in {seconds:.2f} s, {tokens.numel() / seconds:.1f} "
          f"tokens/s, {device}]", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sample text from a trained ltm checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder or file")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=200)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--batch", type=int, default=1, help="samples of the prompt")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quantize", choices=QUANTIZE, default="none")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--compile", action="store_true", help="torch.compile the step")
    parser.add_argument("--cache-dir", help="token cache with the tokenizer (default: "
                        "data.cache_dir of --params)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--latent-scale", type=float, default=1.0,
                        help="latent models: z = scale * N(0, I) (the authors sweep 0.5-1.0)")
    parser.add_argument("--fit-latents", type=int, nargs="?", const=FIT_AS_TRAINED, default=0,
                        metavar="STEPS", help="latent models: z from the posterior fitted to the "
                        "prompt instead, by the checkpoint's own inner loop (train.latent); "
                        "STEPS inner steps (default: as many as it was trained with)")
    parser.add_argument("--prior", metavar="FOLDER", help="latent models: z sampled from the "
                        "learned prior in FOLDER instead (the train stage's data/checkpoints/prior)")
    parser.add_argument("--prior-steps", type=int, default=None,
                        help="its DPM-Solver++ evaluations (default: prior.sample_steps)")
    args = parser.parse_args(argv)
    try:
        run(args)
    except (GenerationError, ParamsError, DataError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
