"""Tokenizers (HF `tokenizers`): byte-level BPE trained on the train split of a text corpus, or
a word-level one over the symbols of the synthetic source. Id 0 is the end-of-text token in both."""
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


def symbol_name(symbol: int) -> str:
    """The token of synthetic symbol `symbol` (0-based): s0, s1, ..."""
    return f"s{symbol}"


def symbol_tokenizer(n_symbols: int) -> Tokenizer:
    """A word-level tokenizer of end-of-text (id 0) and the symbols s0 .. s{n-1} (ids 1 .. n),
    split on whitespace; decoding joins the symbols with spaces. A word that is not a symbol
    (a text prompt) reads as end-of-text: the start of a sequence, all the model knows of it."""
    vocab = {END_OF_TEXT: 0, **{symbol_name(i): i + 1 for i in range(n_symbols)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=END_OF_TEXT))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([END_OF_TEXT])
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
