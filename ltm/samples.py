"""Text sampled from the trained checkpoint, for the train notebook and the report: the prompts
and sampling settings of params.yaml's `samples` section, written as JSON so that the report can
show them and `git diff` can tell what changed."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from ltm.cache import cache_dir_of
from ltm.generate import load_matching_tokenizer, load_model, sample_text
from ltm.params import check, load_section, read_params


@dataclass
class SamplesConfig:
    prompts: list[str] = field(default_factory=lambda: ["ROMEO:", "First Citizen:", "The king"])
    max_new_tokens: int = 60
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 50
    seed: int = 0  # the same text for the same checkpoint
    # latent models: z = latent_scale * N(0, I) (the authors sweep 0.5-1.0; here the decoder
    # RMS-normalises each latent, so a global scale acts only through the norm's eps)
    latent_scale: float = 1.0

    def __post_init__(self) -> None:
        check(len(self.prompts) >= 1, "prompts", "must hold at least one prompt")
        check(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        check(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")


def samples_stage(params_path: str | Path, checkpoint_dir: str | Path,
                  samples_path: str | Path) -> pd.DataFrame:
    """Sample each prompt from the checkpoint in `checkpoint_dir` on the CPU (a few seconds for
    the default model), write {"settings", "samples"} to samples_path and return the samples."""
    cfg = load_section(SamplesConfig, "samples", params_path)
    model = load_model(checkpoint_dir, "cpu")
    tokenizer = load_matching_tokenizer(cache_dir_of(read_params(params_path)), model.cfg.vocab_size)
    # a small model's context may not hold the prompt and max_new_tokens: sample what fits (the
    # prompt is preceded by an end-of-text token) rather than fail the train stage
    longest = max(len(tokenizer.encode(p).ids) + 1 for p in cfg.prompts)
    new_tokens = max(1, min(cfg.max_new_tokens, model.cfg.max_seq_len - longest + 1))
    texts = sample_text(model, tokenizer, cfg.prompts, new_tokens, cfg.temperature, cfg.top_k,
                        seed=cfg.seed, latent_scale=cfg.latent_scale)
    rows = [{"prompt": prompt, "text": text} for prompt, text in zip(cfg.prompts, texts)]
    settings = {k: v for k, v in asdict(cfg).items() if k != "prompts"}
    settings["new_tokens_sampled"] = new_tokens
    Path(samples_path).parent.mkdir(parents=True, exist_ok=True)
    Path(samples_path).write_text(json.dumps({"settings": settings, "samples": rows}, indent=1) + "\n")
    return pd.DataFrame(rows)
