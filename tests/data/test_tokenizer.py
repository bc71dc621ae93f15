import random

import pytest

from ltm.data.corpus import DataError
from ltm.data.tokenizer import (END_OF_TEXT, end_of_text_id, load_tokenizer, save_tokenizer,
                                symbol_tokenizer, train_tokenizer)

TEXTS = ["Now is the winter of our discontent", "Made glorious summer by this sun of York;",
         "And all the clouds that lour'd upon our house"] * 20


def test_round_trip_of_any_text_including_unseen_bytes(tmp_path):
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    save_tokenizer(tokenizer, tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    rng = random.Random()
    unseen = "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(200))
    for text in [TEXTS[0], "  leading spaces\n\ttabs", "émigré 東京 🙂", unseen]:
        ids = loaded.encode(text).ids
        assert max(ids) < loaded.get_vocab_size()
        assert loaded.decode(ids) == text


def test_vocabulary_size_and_merges():
    tokenizer = train_tokenizer(TEXTS, vocab_size=320)
    assert tokenizer.get_vocab_size() <= 320
    assert end_of_text_id(tokenizer) == tokenizer.token_to_id(END_OF_TEXT) == 0
    # merges learned on the train text compress it below one token per byte
    ids = tokenizer.encode(TEXTS[0]).ids
    assert len(ids) < len(TEXTS[0].encode())


def test_too_small_vocabulary_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="too small for byte fallback"):
        train_tokenizer(TEXTS, vocab_size=200)
    with pytest.raises(DataError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "none.json")


def test_symbol_tokenizer_round_trips_and_reads_other_words_as_end_of_text(tmp_path):
    save_tokenizer(symbol_tokenizer(5), tmp_path / "tok.json")
    tokenizer = load_tokenizer(tmp_path / "tok.json")
    assert tokenizer.get_vocab_size() == 6 and end_of_text_id(tokenizer) == 0
    assert tokenizer.encode("s0 s4  s2\ns1").ids == [1, 5, 3, 2]
    assert tokenizer.decode([0, 1, 5, 3]) == "s0 s4 s2"
    assert tokenizer.encode("ROMEO: s3").ids == [0, 4]
