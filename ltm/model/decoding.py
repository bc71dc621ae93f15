"""Generation from static buffers in the style of gpt-fast: every state allocated once, the
one-token step captured in a CUDA graph (and optionally compiled), sampling on the device.
`ltm.generate` loads checkpoints and tokenizers around it and is the command.

`LTM.generate` stays the readable reference: a fresh cache per call and a Python loop that
launches each layer's small kernels per token, which on an H100 left decoding ~100x above the
memory floor. `Decoder` runs the same blocks on static buffers (attention's KV cache indexed by a
(B,) position tensor, the linear mixers' fixed-size states), so one step is one graph replay.

    tokens = generate_tokens(model, [[1, 2, 3], [4, 5]], max_new_tokens=20, Sampling(top_k=8))
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from ltm.model.mixers import Attention
from ltm.model.titans import Titans
from ltm.model.lm import LTM, Cache, sample

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
    # attention's cache (also the one inside Titans) needs only `length` positions; the
    # recurrent states have a fixed size
    if isinstance(mixer, (Attention, Titans)):
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
