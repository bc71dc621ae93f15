"""Fast text generation in the style of gpt-fast: every state in buffers allocated once, the
one-token step captured in a CUDA graph (and optionally compiled), sampling on the device.

    python -m ltm.generate --checkpoint data/checkpoints --prompt "ROMEO:" --max-new-tokens 200
    python -m ltm.generate --checkpoint data/checkpoints/counterpart-latent --prior data/checkpoints/prior
    texts = sample_text("data/checkpoints", "data/cache", ["ROMEO:", "JULIET:"], seed=0)

`LTM.generate` stays the readable reference: a fresh cache per call and a Python loop that
launches each layer's small kernels per token, which on an H100 left decoding ~100x above the
memory floor. `Decoder` runs the same blocks on static buffers (attention's KV cache indexed by a
(B,) position tensor, the linear mixers' fixed-size states), so one step is one graph replay.
"""
from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from tokenizers import Tokenizer
from torch import nn

from ltm import checkpoint as ckpt
from ltm.cache import TOKENIZER_FILE, TokenCache, cache_dir_of
from ltm.corpus import DataError
from ltm.mixers import Attention
from ltm.model import LTM, Cache, ModelConfig, sample
from ltm.params import ParamsError, from_mapping, read_params
from ltm.tokenizer import end_of_text_id, load_tokenizer

QUANTIZE = ("none", "int8", "int4")
# int4 weights are quantised in groups of this many input features (torchao's default)
INT4_GROUP = 128
# streaming brings tokens to the host in chunks: one device sync per chunk, not per token
STREAM_EVERY = 8
# steps run before the CUDA graph is captured (Triton / inductor compile, cuBLAS warm-up)
WARMUP_STEPS = 2


class GenerationError(ValueError):
    """Why generation cannot run, in one line (the command prints it without a traceback)."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the fewest most likely tokens reaching this probability

    def __post_init__(self) -> None:
        if self.temperature < 0 or (self.top_k is not None and self.top_k < 1) or not (
                self.top_p is None or 0 < self.top_p <= 1):
            raise GenerationError(f"sampling: need temperature >= 0, top_k >= 1 and top_p in "
                                  f"(0, 1], got {self.temperature}, {self.top_k}, {self.top_p}")


def _init_state(mixer: nn.Module, batch: int, length: int, device, dtype) -> dict:
    # attention's cache needs only `length` positions; the recurrent states have a fixed size
    if isinstance(mixer, Attention):
        return mixer.init_state(batch, device, dtype, length=length)
    return mixer.init_state(batch, device, dtype)


def decode_step(model: LTM, states: list[dict], latent_kv: list | None, token: torch.Tensor,
                sampling: Sampling) -> None:
    """Advance every row by the token in `token` (B, 1) and sample the next one into it. States
    are updated in place (a captured graph replays on the same buffers)."""
    x = model.embed(token)  # (B, 1, C)
    for layer, block in enumerate(model.blocks):
        state = states[layer]
        x, new = block(x, None if latent_kv is None else latent_kv[layer], state)
        for key, value in new.items():
            # the KV cache was written in place already; recurrent states come back as new tensors
            if value is not None and value is not state[key]:
                state[key].copy_(value)
    logits = model.lm_head(model.final_norm(x[:, -1]))  # (B, vocab)
    token.copy_(sample(logits, sampling.temperature, sampling.top_k, None, sampling.top_p))


class Decoder:
    """Generation for `batch` rows of at most `length` positions from static buffers. The step
    reads `self.token` (B, 1) and writes the next token there; on a GPU it is captured once in a
    CUDA graph (`graph`, default on for CUDA) and replayed per token, and `compile` runs it through
    torch.compile first (fusing its elementwise kernels). Without capture it runs eagerly: the
    same code, which the CPU tests compare with LTM.generate.

    Ragged prompts: each group of equally long prompts is prefilled in parallel on a cache of its
    own (the chunked kernels, as LTM.generate does) and copied into its rows; then all rows decode
    together, each at its own position. Chosen over left padding because padding tokens would run
    through the recurrent states, token shift and convolution (every mixer's sequence form would
    need a mask), and because this way each row computes exactly what its prompt alone would."""

    @torch.no_grad()
    def __init__(self, model: LTM, batch: int, length: int, sampling: Sampling = Sampling(),
                 z: torch.Tensor | None = None, compile: bool = False, graph: bool | None = None):
        if not 1 <= length <= model.cfg.max_seq_len:
            raise GenerationError(f"length: {length} positions, the model has 1 to "
                                  f"{model.cfg.max_seq_len}")
        weight = model.embed.weight
        self.model, self.batch, self.length, self.sampling = model.eval(), batch, length, sampling
        self.device, self.dtype = weight.device, weight.dtype
        self.states = [_init_state(block.mixer, batch, length, self.device, self.dtype)
                       for block in model.blocks]
        for state in self.states:
            if "pos" in state:
                # a tensor, not an int: one step serves every position (see Attention)
                state["pos"] = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.latent_kv = model.latent_kv(z, batch)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self._step = torch.compile(decode_step, dynamic=False) if compile else decode_step
        self.graph: torch.cuda.CUDAGraph | None = None
        if graph is None:
            graph = self.device.type == "cuda"
        if graph:
            self._capture()

    def _run(self) -> None:
        self._step(self.model, self.states, self.latent_kv, self.token, self.sampling)

    def _capture(self) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                # from position 0 each time, so a short cache is never overrun
                self.reset()
                self._run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.reset()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._run()

    def reset(self) -> None:
        for state in self.states:
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()
        self.token.zero_()

    def cache_bytes(self) -> int:
        """Memory of the generation state: KV caches, recurrent states, latents' keys/values."""
        tensors = [v for state in self.states for v in state.values() if torch.is_tensor(v)]
        tensors += [t for kv in self.latent_kv or [] for t in kv]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.no_grad()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Fill every row from its prompt (token ids (T_b,), 1 <= T_b <= length); returns the first
        sampled token of each row, (B, 1), which is also the next step's input."""
        if len(prompts) != self.batch:
            raise GenerationError(f"prompts: {len(prompts)} given for a batch of {self.batch}")
        groups: dict[int, list[int]] = defaultdict(list)
        for row, prompt in enumerate(prompts):
            if not 1 <= len(prompt) <= self.length:
                raise GenerationError(f"prompt {row}: {len(prompt)} tokens, the cache holds 1 to "
                                      f"{self.length}")
            groups[len(prompt)].append(row)
        logits = None
        for length, rows in groups.items():
            index = torch.tensor(rows, device=self.device)
            idx = torch.stack([torch.as_tensor(prompts[r]) for r in rows]).to(self.device)  # (G, T)
            kv = None
            if self.latent_kv is not None:
                kv = [(k[index], v[index]) for k, v in self.latent_kv]
            cache = Cache([_init_state(block.mixer, len(rows), length, self.device, self.dtype)
                           for block in self.model.blocks], kv)
            out = self.model.forward_cached(idx, cache, last_only=True)[:, -1]  # (G, vocab)
            if logits is None:
                logits = out.new_empty(self.batch, out.shape[-1])
            logits[index] = out
            for static, fresh in zip(self.states, cache.states):
                _write_rows(static, fresh, index)
        s = self.sampling
        self.token.copy_(sample(logits, s.temperature, s.top_k, None, s.top_p))
        return self.token

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """One token for every row: the sampled tokens (B, 1), a buffer the next step reuses."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run()
        return self.token

    @torch.no_grad()
    def generate(self, prompts: Sequence[torch.Tensor], max_new_tokens: int,
                 on_tokens: Callable[[torch.Tensor], bool | None] | None = None,
                 every: int = STREAM_EVERY) -> torch.Tensor:
        """max_new_tokens new tokens per row, (B, max_new_tokens), kept on the device. on_tokens
        (streaming) gets each chunk of `every` new tokens on the host, (B, n); returning True
        stops early (the result then ends there)."""
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens - 1 > self.length:
            raise GenerationError(f"max_new_tokens: a prompt of {longest} tokens and "
                                  f"{max_new_tokens} new tokens overrun the cache of {self.length}")
        out = torch.zeros(self.batch, max_new_tokens, dtype=torch.long, device=self.device)
        if max_new_tokens == 0:
            return out
        out[:, :1] = self.prefill(prompts)
        sent = 0
        for done in range(1, max_new_tokens + 1):  # `done` tokens are in out
            if on_tokens is not None and (done - sent == every or done == max_new_tokens):
                stop, sent = on_tokens(out[:, sent:done].cpu()), done
                if stop:
                    return out[:, :done]
            if done < max_new_tokens:
                out[:, done:done + 1] = self.step()
        return out


def _write_rows(static: dict, fresh: dict, rows: torch.Tensor) -> None:
    """Copy a prefilled state (G rows) into rows `rows` of the static one; a KV cache fills the
    first positions of the longer static cache."""
    for key, value in fresh.items():
        if value is None:
            continue
        if not torch.is_tensor(value):  # attention's int position
            static[key][rows] = value
            continue
        static[key][(rows, *(slice(0, n) for n in value.shape[1:]))] = value.to(static[key].dtype)


def check_fits(prompt_len: int, max_new_tokens: int, context: int) -> None:
    """One-line errors for a prompt (and continuation) the model's context cannot hold."""
    if max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
    if prompt_len > context:
        raise GenerationError(f"the prompt is {prompt_len} tokens, longer than the model's "
                              f"context of {context} tokens")
    # the last new token is never fed back, so it needs no position
    if prompt_len + max_new_tokens - 1 > context:
        raise GenerationError(f"the prompt ({prompt_len} token{'s' * (prompt_len != 1)}) and "
                              f"{max_new_tokens} new tokens "
                              f"do not fit the model's context of {context} tokens: ask for at "
                              f"most {context - prompt_len + 1} new tokens")


def generate_tokens(model: LTM, prompts: Sequence[Sequence[int] | torch.Tensor],
                    max_new_tokens: int, sampling: Sampling = Sampling(),
                    z: torch.Tensor | None = None, compile: bool = False,
                    graph: bool | None = None, on_tokens=None) -> torch.Tensor:
    """New tokens (B, max_new_tokens) continuing each prompt (ragged lengths allowed)."""
    prompts = [torch.as_tensor(p, dtype=torch.long) for p in prompts]
    longest = max(len(p) for p in prompts)
    check_fits(longest, max_new_tokens, model.cfg.max_seq_len)
    decoder = Decoder(model, len(prompts), longest + max(max_new_tokens - 1, 0), sampling, z,
                      compile, graph)
    return decoder.generate(prompts, max_new_tokens, on_tokens)


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


def load_model(checkpoint: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> LTM:
    """The model of a train-stage checkpoint (its folder or file); its config is inside."""
    path = Path(checkpoint)
    if path.is_dir():
        path = path / ckpt.CHECKPOINT_FILE
    saved = ckpt.load_checkpoint(path)
    if saved is None:
        raise GenerationError(f"{path}: no checkpoint there (train one first: dvc repro train)")
    if not isinstance(saved, dict) or "model" not in saved or "model_cfg" not in saved:
        raise GenerationError(f"{path}: not a checkpoint of ltm.train (no model or model_cfg)")
    model = LTM(from_mapping(ModelConfig, saved["model_cfg"], f"{path}: model_cfg"))
    model.load_state_dict(saved["model"])
    return model.to(device=device, dtype=dtype).eval()


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
                latent_fit_steps: int = 0) -> list[str]:
    """Each prompt followed by its sampled continuation, cut at the first end-of-text. model: an
    LTM or a checkpoint (folder or file); tokenizer: one, or its file, or the token cache folder.
    A given model is put in eval mode, and copied before quantisation. A latent model's z is
    drawn from its prior N(0, I) scaled by latent_scale (the authors sweep 0.5-1.0) or, with
    latent_fit_steps > 0, is a sample of the posterior fitted to each prompt by that many inner
    steps (ltm.latent, the train.latent defaults)."""
    if isinstance(model, LTM):
        model = copy.deepcopy(model) if quantize != "none" else model
    else:
        model = load_model(model, _device(device or "auto"))
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_matching_tokenizer(tokenizer, model.cfg.vocab_size)
    model = quantize_model(model, quantize)
    if seed is not None:
        torch.manual_seed(seed)
    eot = end_of_text_id(tokenizer)
    # a document starts after an end-of-text in the token cache
    ids = [[eot] + tokenizer.encode(p).ids for p in prompts]
    z = prompt_latents(model, ids, latent_scale, latent_fit_steps)
    tokens = generate_tokens(model, ids, max_new_tokens, Sampling(temperature, top_k, top_p),
                             z=z, compile=compile)
    return [p + _decode(tokenizer, row, eot) for p, row in zip(prompts, tokens.tolist())]


def prompt_latents(model: LTM, ids: list[list[int]], scale: float, fit_steps: int
                   ) -> torch.Tensor | None:
    """z (B, n_layers * n_latent, d_model) for generation, None for a plain model: scale * N(0, I),
    or with fit_steps > 0 a sample of the posterior fitted to each prompt (its tokens predicting
    their successors)."""
    if model.cfg.n_latent == 0:
        return None
    from ltm.latent import LatentConfig, decoder_fitter, latent_shape
    device = model.embed.weight.device
    if fit_steps <= 0:
        return scale * torch.randn(latent_shape(model.cfg, len(ids)), device=device)
    rows = []
    fitter = decoder_fitter(model, LatentConfig(steps=fit_steps))
    for row in ids:  # prompts differ in length: one posterior each
        seq = torch.tensor(row, device=device)[None]
        if seq.shape[1] < 2:
            rows.append(scale * torch.randn(latent_shape(model.cfg, 1), device=device))
            continue
        with torch.enable_grad():
            posterior = fitter.fit((seq[:, :-1], seq[:, 1:]), latent_shape(model.cfg, 1))
        rows.append(posterior.sample().detach())
    return torch.cat(rows)


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
    z = prompt_latents(model, [prompt.tolist()] * args.batch, args.latent_scale, args.fit_latents)
    if args.prior:  # the third way: z from the learned prior (ltm.prior, DPM-Solver++)
        from ltm.prior import latents, load_prior
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
    parser.add_argument("--fit-latents", type=int, default=0, metavar="STEPS",
                        help="latent models: z from the posterior fitted to the prompt instead")
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
