"""Byte-level BPE tokenizer (HF `tokenizers`), trained on the train split only."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ltm.data.corpus import DataError

END_OF_TEXT = "<|endoftext|>"
# 256 byte symbols + the end-of-text token: anything smaller cannot encode every byte
MIN_VOCAB_SIZE = 257


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (id 0 is the end-of-text token)."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise DataError(f"data.vocab_size={vocab_size} is too small for byte fallback: "
                        f"byte-level BPE needs at least {MIN_VOCAB_SIZE} (256 bytes + end-of-text)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> None:
    tokenizer.save(str(path))


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: tokenizer not found; build the cache first (dvc repro tokenize)")
    return Tokenizer.from_file(str(path))


def end_of_text_id(tokenizer: Tokenizer) -> int:
    return tokenizer.token_to_id(END_OF_TEXT)
